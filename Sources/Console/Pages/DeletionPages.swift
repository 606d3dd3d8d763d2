import BrokerCore
import BrokerCrypto
import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// Deletions: the list, one request's timeline, retry (confirm, then perform), a new
/// deletion (identify, confirm with masked identities, perform) and the evidence report.
/// Every action goes through `DeletionService` / `DeletionStore`, as the JSON API's do.
struct DeletionPages {
    let service: DeletionService
    let store: ConsoleStore
    let finder: ExactLookup

    // MARK: List and detail

    func list(_ request: ConsoleRequest) throws -> HTTPResponse {
        let stateText = request.http.query["state"].flatMap { $0.isEmpty ? nil : $0 }
        let state = try stateText.map { text -> DeletionState in
            guard let state = DeletionState(rawValue: text) else { throw ConsoleRefusal.invalid("Unknown state “\(text)”.") }
            return state
        }
        let records = try service.store.list(state: state, limit: 200)
        let notes = try store.annotations(records.map(\.id))
        let rows: [[HTML]] = records.map { record in
            let note = notes[record.id]
            let due = DeletionWords.due(
                receivedAt: note?.receivedAt, createdAt: record.createdAt, extendedUntil: note?.extendedUntil)
            return [
                "<a href=\"/deletions/\(record.id.lowercasedString)\">\(record.id.lowercasedString)</a>",
                "<span class=\"state-\(record.state.rawValue)\">\(DeletionWords.state(record.state))</span>",
                "\(record.source.rawValue)",
                "\(RFC3339Date.dayString(note?.receivedAt ?? record.createdAt))",
                "\(RFC3339Date.dayString(due))",
                "\(DeletionWords.daysLeft(due, state: record.state))",
            ]
        }
        let options = HTML.join(
            [HTML("<option value=\"\">any state</option>")]
                + DeletionState.allCases.map { option in
                    "<option value=\"\(option.rawValue)\"\(state == option ? HTML(" selected") : .empty)>\(option.rawValue)</option>"
                })
        return Layout.page(
            "Deletions", session: request.session,
            """
            <form method="get" action="/deletions"><label for="state">State</label>
            <select id="state" name="state">\(options)</select> <button type="submit">Filter</button></form>
            \(HTML.table(caption: "\(records.count) deletion requests, newest first", headers: ["Deletion", "State", "Source", "Received", "Due", "Left"], rows: rows))
            """)
    }

    func detail(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let record = try record(request)
        let note = try store.annotations([record.id])[record.id]
        let due = DeletionWords.due(receivedAt: note?.receivedAt, createdAt: record.createdAt, extendedUntil: note?.extendedUntil)
        let steps: [[HTML]] = (record.steps ?? []).map { step in
            [
                "\(RFC3339Date.string(step.at))", "\(DeletionWords.step(step.step))", "\(step.clientID ?? "")",
                "\(DeletionWords.outcome(step.outcome))",
            ]
        }
        var actions: [HTML] = []
        if record.state == .failed && session.allows(.retriers) {
            actions.append("<li><a href=\"/deletions/\(record.id.lowercasedString)/retry\">Retry this deletion</a></li>")
        }
        var extendForm: HTML = .empty
        if session.allows(.compliance) && record.state != .done {
            extendForm = """
                <h2>Extend the deadline</h2>
                <form method="post" action="/deletions/\(record.id.lowercasedString)/extend">\(Layout.csrfField(session))
                <label for="extended_until">Answer due on (at most three months after receipt)</label>
                <input id="extended_until" name="extended_until" type="date" required>
                <label for="extension_reason">Reason given to the requester</label>
                <input id="extension_reason" name="extension_reason" required maxlength="500">
                <button type="submit">Extend</button></form>
                """
        }
        if session.allows(.compliance) {
            actions.append(
                "<li><a href=\"/deletions/\(record.id.lowercasedString)/report\">Evidence report</a> (<a href=\"/deletions/\(record.id.lowercasedString)/report.json\">JSON</a>)</li>"
            )
        }
        return Layout.page(
            "Deletion \(record.id.lowercasedString)", session: session,
            """
            <dl><dt>State</dt><dd class="state-\(record.state.rawValue)">\(DeletionWords.state(record.state))</dd>
            <dt>Revocation at Apple</dt><dd>\(DeletionWords.revocation(record.appleRevocation))</dd>
            <dt>Source</dt><dd>\(record.source.rawValue)</dd>
            <dt>Reason</dt><dd>\(record.reason)</dd>
            <dt>Ticket</dt><dd>\(note?.ticket ?? "none")</dd>
            <dt>Received</dt><dd>\(RFC3339Date.string(note?.receivedAt ?? record.createdAt))</dd>
            <dt>Opened</dt><dd>\(RFC3339Date.string(record.createdAt))</dd>
            <dt>Due</dt><dd>\(RFC3339Date.dayString(due)) (\(DeletionWords.daysLeft(due, state: record.state)))\(note?.extendedUntil == nil ? "" : ", extended: " + (note?.extensionReason ?? ""))</dd>
            <dt>Attempts</dt><dd>\(record.attempts)</dd>
            <dt>Next attempt</dt><dd>\(record.state == .done || record.state == .failed ? "none" : RFC3339Date.string(record.nextAttemptAt))</dd>
            <dt>Completed</dt><dd>\(record.completedAt.map(RFC3339Date.string) ?? "not yet")</dd></dl>
            \(actions.isEmpty ? HTML.empty : "<ul>\(actions)</ul>")
            \(record.appGroups?.isEmpty == false ? groupTable(record) : HTML.empty)
            \(HTML.table(caption: "Timeline: each step, and the revocation outcome per client id", headers: ["At", "Step", "Client id", "Outcome"], rows: steps))
            \(extendForm)
            """)
    }

    func extend(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let record = try record(request)
        guard let until = RFC3339Date.day(try request.field("extended_until", maximum: 10)) else {
            throw ConsoleRefusal.invalid("Give the new due date as YYYY-MM-DD.")
        }
        let reason = try request.field("extension_reason", maximum: 500)
        guard try store.extend(record.id, until: until, reason: reason, actor: session.actor) else {
            throw ConsoleRefusal.invalid(
                "The new date must fall after the first month and at most three months after receipt, and the deletion must not be done."
            )
        }
        return Layout.redirect("/deletions/\(record.id.lowercasedString)")
    }

    // MARK: Retry

    func retryConfirm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let record = try record(request)
        guard record.state == .failed else {
            return Layout.refusal(
                409, "Cannot retry", "Only a failed deletion can be retried; this one is: \(DeletionWords.state(record.state)).",
                session: session)
        }
        let id = record.id.lowercasedString
        return Layout.page(
            "Retry deletion \(id)", session: session,
            """
            <p>This deletion stopped after \(record.attempts) attempts. Retrying puts it back in the queue: the job
            revokes the user’s remaining tokens at Apple, then purges the account data.</p>
            <form method="post" action="/deletions/\(id)/retry">\(Layout.csrfField(session))
            <button type="submit" class="danger">Retry the deletion</button></form>
            <p><a href="/deletions/\(id)">Cancel</a></p>
            """)
    }

    func retry(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let record = try record(request)
        guard try service.retry(record.id, by: session.actor) else {
            return Layout.refusal(409, "Cannot retry", "Only a failed deletion can be retried.", session: session)
        }
        return Layout.redirect("/deletions/\(record.id.lowercasedString)")
    }

    // MARK: New deletion

    func newForm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        return Layout.page(
            "New deletion", session: session,
            """
            <p>Identify the user by one exact value. Nothing is searched by pattern.</p>
            <form method="post" action="/deletions/new">\(Layout.csrfField(session))\(ExactLookup.fields("Identify by"))
            <button type="submit">Find the user</button></form>
            """)
    }

    func identify(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let (kind, users) = try finder.find(request, by: session)
        guard !users.isEmpty else {
            return Layout.refusal(
                404, "No user found", "No user matches this \(kind.replacingOccurrences(of: "_", with: " ")).", session: session)
        }
        if users.count == 1 { return try confirmation(session: session, userID: users[0], lead: kind == "email") }
        let leads = HTML.join(
            users.map { id in
                """
                <li><form method="post" action="/deletions/new">\(Layout.csrfField(session))
                <input type="hidden" name="identify_by" value="user_id"><input type="hidden" name="value" value="\(id.lowercasedString)">
                User \(id.lowercasedString) <button type="submit">Choose</button></form></li>
                """
            })
        return Layout.page(
            "Several users match", session: session,
            "<p>This e-mail address is a lead, not an identity: check each user before choosing.</p><ul>\(leads)</ul>")
    }

    private func confirmation(session: ConsoleSession, userID: UUID, lead: Bool) throws -> HTTPResponse {
        let identities = try store.identities(of: userID)
        let rows: [[HTML]] = identities.map { identity in
            var email = Masking.email(identity.email)
            if identity.email != nil {
                email += identity.emailVerified ? "" : " (unverified)"
                email += identity.isPrivateEmail ? " (private relay)" : ""
            }
            return [
                "\(Masking.sub(identity.sub))", "\(identity.clientID)", "\(email)", "\(identity.consent)",
                "\(identity.liveTokens.isEmpty ? "none (manual revocation will be needed, TN3194)" : identity.liveTokens.joined(separator: ", "))",
            ]
        }
        let code = Self.confirmationCode(session: session, userID: userID)
        let id = userID.lowercasedString
        return Layout.page(
            "Confirm the deletion", session: session,
            """
            \(lead ? HTML("<p class=\"refusal\">Found by e-mail address: an address is a lead, not proof of identity. Check that it is verified.</p>") : .empty)
            <p>User <strong>\(id)</strong> will be deleted: every token is revoked at Apple, then the account data is
            purged. A tombstone (keyed hash of the sub) and the audit log are kept.</p>
            \(HTML.table(caption: "Apple identities (masked)", headers: ["Apple sub", "Last signed in with", "E-mail", "Consent", "Live tokens per client id"], rows: rows))
            <form method="post" action="/deletions/create">\(Layout.csrfField(session))
            <input type="hidden" name="user_id" value="\(id)">
            <label for="reason">Reason</label><input id="reason" name="reason" required maxlength="500">
            <label for="ticket">Ticket</label><input id="ticket" name="ticket" required maxlength="200">
            <label for="received_date">Request received on</label><input id="received_date" name="received_date" type="date" required>
            <p>Type the code <span class="code">\(code)</span> to confirm.</p>
            <label for="confirmation_code">Confirmation code</label>
            <input id="confirmation_code" name="confirmation_code" required maxlength="12" autocomplete="off">
            <button type="submit" class="danger">Delete this user</button></form>
            <p><a href="/deletions/new">Cancel</a></p>
            """)
    }

    func create(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        guard let userID = UUID(uuidString: try request.field("user_id", maximum: 36)) else {
            throw ConsoleRefusal.invalid("The user id is not a UUID.")
        }
        let reason = try request.field("reason", maximum: 500)
        let ticket = try request.field("ticket", maximum: 200)
        guard let received = RFC3339Date.day(try request.field("received_date", maximum: 10)),
            received.timeIntervalSinceNow < 86_400
        else { throw ConsoleRefusal.invalid("Give the date the request was received (YYYY-MM-DD), not in the future.") }
        let typed = try request.field("confirmation_code", maximum: 12).uppercased()
        guard typed == Self.confirmationCode(session: session, userID: userID) else {
            throw ConsoleRefusal.invalid("The confirmation code does not match the one on the confirmation page.")
        }
        let result: (id: UUID, state: DeletionState, created: Bool)
        do {
            // Source `api`: the compliance surface (the previous release reads no other value).
            result = try service.request(
                DeletionService.Request(target: .user(userID), reason: reason, requestedBy: session.actor), source: .api,
                actor: session.actor)
        } catch let error as BrokerError where error.code == .userNotFound || error.code == .userDeleted {
            return Layout.refusal(
                409, "Not deleted", error.code == .userDeleted ? "This user was deleted already." : "No such user.",
                session: session)
        }
        if result.created { try store.annotate(result.id, receivedAt: received, ticket: ticket, actor: session.actor) }
        return Layout.redirect("/deletions/\(result.id.lowercasedString)")
    }

    /// Six characters the operator types to confirm: derived from the session and the user,
    /// so nothing is stored and a code from another session or for another user never fits.
    static func confirmationCode(session: ConsoleSession, userID: UUID) -> String {
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        let digest = SHA256.hash("console-confirm|\(session.secret)|\(userID.lowercasedString)")
        return String(digest.prefix(6).map { alphabet[Int($0) % alphabet.count] })
    }

    // MARK: Evidence

    /// The evidence of one deletion, without personal data: ids, steps, client ids, times.
    func evidence(_ record: DeletionRecord) throws -> JSONValue {
        let note = try store.annotations([record.id])[record.id]
        let purged = record.state == .done ? try store.purgedAt(deletionID: record.id) : nil
        let deliveries = record.state == .done ? try store.userDeletedDeliveries(userID: record.userID) : []
        func time(_ date: Date?) -> JSONValue { date.map { .string(RFC3339Date.string($0)) } ?? .null }
        let revocations: [JSONValue] = (record.steps ?? []).filter { $0.clientID != nil }.map { step in
            .object([
                "client_id": .string(step.clientID ?? ""), "step": .string(step.step.rawValue),
                "outcome": .string(step.outcome.rawValue), "at": time(step.at),
            ])
        }
        let timeline: [JSONValue] = (record.steps ?? []).map { step in
            .object([
                "at": time(step.at), "step": .string(step.step.rawValue), "outcome": .string(step.outcome.rawValue),
                "client_id": step.clientID.map(JSONValue.string) ?? .null,
            ])
        }
        let sent: [JSONValue] = deliveries.map { delivery in
            .object([
                "subscription_id": .string(delivery.subscriptionID.lowercasedString), "state": .string(delivery.state),
                "attempts": .integer(Int64(delivery.attempts)), "delivered_at": time(delivery.deliveredAt),
            ])
        }
        var members: [String: JSONValue] = [
            "deletion_id": .string(record.id.lowercasedString), "state": .string(record.state.rawValue),
            "source": .string(record.source.rawValue),
        ]
        members["ticket"] = note?.ticket.map(JSONValue.string) ?? .null
        members["received_at"] = time(note?.receivedAt)
        members["requested_at"] = time(record.createdAt)
        members["completed_at"] = time(record.completedAt)
        members["purged_at"] = time(purged)
        members["apple_revocation"] = record.appleRevocation.map { .string($0.rawValue) } ?? .null
        let followUp = try followUp(record)
        members["follow_up"] = .string(
            followUp.required ? (followUp.closedAt == nil ? "manual_revocation_required" : "manual_revocation_closed") : "none")
        members["follow_up_closed_at"] = time(followUp.closedAt)
        members["app_groups"] = .array(
            (record.appGroups ?? []).map { group in
                .object([
                    "app_id": .string(group.appID), "client_ids": .array(group.clientIDs.map(JSONValue.string)),
                    "apple_revocation": .string(group.revocation.rawValue),
                    "follow_up": group.followUp.map(JSONValue.string) ?? .null,
                    "follow_up_closed_at": time(group.followUpClosedAt),
                    "follow_up_closed_by": group.followUpClosedBy.map(JSONValue.string) ?? .null,
                ])
            })
        members["timeline"] = .array(timeline)
        members["revocations"] = .array(revocations)
        members["user_deleted_deliveries"] = .array(sent)
        return .object(members)
    }

    func reportJSON(_ request: ConsoleRequest) throws -> HTTPResponse {
        let record = try record(request)
        var response = HTTPResponse.json(try evidence(record))
        response.headers.set(
            "Content-Disposition", "attachment; filename=\"deletion-\(record.id.lowercasedString).json\"")
        return response
    }

    func report(_ request: ConsoleRequest) throws -> HTTPResponse {
        let record = try record(request)
        let note = try store.annotations([record.id])[record.id]
        let purged = record.state == .done ? try store.purgedAt(deletionID: record.id) : nil
        let deliveries = record.state == .done ? try store.userDeletedDeliveries(userID: record.userID) : []
        let revocations: [[HTML]] = (record.steps ?? []).filter { $0.clientID != nil }.map { step in
            [
                "\(step.clientID ?? "")", "\(DeletionWords.step(step.step))", "\(DeletionWords.outcome(step.outcome))",
                "\(RFC3339Date.string(step.at))",
            ]
        }
        let sent: [[HTML]] = deliveries.map { delivery in
            [
                "\(delivery.subscriptionID.lowercasedString)", "\(delivery.state)", "\(delivery.attempts)",
                "\(delivery.deliveredAt.map(RFC3339Date.string) ?? "not delivered")",
            ]
        }
        let followUp = try followUp(record)
        let followUpWords: String
        if !followUp.required {
            followUpWords = "none"
        } else if let closed = followUp.closedAt {
            followUpWords = "manual revocation (TN3194): closed, the user revoked at Apple (\(RFC3339Date.string(closed)))"
        } else {
            let open = (record.appGroups ?? []).filter { $0.followUp == "open" }.map(\.appID)
            followUpWords =
                "manual revocation required (TN3194): open" + (open.isEmpty ? "" : " for " + open.joined(separator: ", "))
        }
        let checklist: HTML = """
            <ul><li>Account data purged: \(purged.map { "yes, " + RFC3339Date.string($0) } ?? "no, not yet")</li>
            <li>Tokens at Apple: \(DeletionWords.revocation(record.appleRevocation))</li>
            <li>Sign-ins refused from the request on (409 user_deletion_pending)</li>
            <li>Downstream told (user.deleted): \(deliveries.isEmpty ? "no subscriber, or not yet" : "\(deliveries.filter { $0.state == "delivered" }.count) of \(deliveries.count) delivered")</li></ul>
            """
        return Layout.page(
            "Evidence: deletion \(record.id.lowercasedString)", session: request.session,
            """
            <p class="hint">No personal data: ids, client ids, steps and times only.</p>
            <dl><dt>State</dt><dd>\(DeletionWords.state(record.state))</dd>
            <dt>Ticket</dt><dd>\(note?.ticket ?? "none")</dd>
            <dt>Received</dt><dd>\(note?.receivedAt.map(RFC3339Date.string) ?? "not recorded")</dd>
            <dt>Requested</dt><dd>\(RFC3339Date.string(record.createdAt))</dd>
            <dt>Purged</dt><dd>\(purged.map(RFC3339Date.string) ?? "not yet")</dd>
            <dt>Follow-up</dt><dd>\(followUpWords)</dd></dl>
            \(checklist)
            \(groupTable(record))
            \(HTML.table(caption: "Revocation per client id", headers: ["Client id", "Step", "Outcome", "At"], rows: revocations))
            \(HTML.table(caption: "user.deleted deliveries per subscription (Art. 19)", headers: ["Subscription", "State", "Attempts", "Delivered"], rows: sent))
            """)
    }

    /// Whether the deletion needs the user to act at Apple (TN3194) for some app group, and when
    /// the last of those follow-ups closed (nil while one is open). A deletion the previous
    /// release decided has no groups: its closure is read from the inbox, as it was.
    private func followUp(_ record: DeletionRecord) throws -> (required: Bool, closedAt: Date?) {
        guard record.appleRevocation == .manualRequired else { return (false, nil) }
        let manual = (record.appGroups ?? []).filter { $0.revocation == .manualRequired }
        if !manual.isEmpty {
            return (true, manual.contains { $0.followUpClosedAt == nil } ? nil : manual.compactMap(\.followUpClosedAt).max())
        }
        return (true, record.state == .done ? try store.legacyFollowUpClosedAt(deletionID: record.id) : nil)
    }

    /// The deletion's outcome per app group, as a table for people.
    private func groupTable(_ record: DeletionRecord) -> HTML {
        let rows: [[HTML]] = (record.appGroups ?? []).map { group in
            [
                "\(group.appID)", "\(group.clientIDs.joined(separator: ", "))", "\(DeletionWords.group(group.revocation))",
                "\(DeletionWords.followUp(group))",
            ]
        }
        return HTML.table(
            caption: "Revocation per app group (revoking ends one app group's authorization only)",
            headers: ["App group", "Client ids", "At Apple", "Follow-up (TN3194)"], rows: rows)
    }

    private func record(_ request: ConsoleRequest) throws -> DeletionRecord {
        guard let text = request.http.pathParameters["id"], let id = UUID(uuidString: text),
            let record = try service.store.record(id)
        else { throw ConsoleRefusal.notFound }
        return record
    }
}

/// Personal data as the console shows it unless revealed: enough to tell records apart.
enum Masking {
    static func sub(_ sub: String) -> String { String(sub.prefix(6)) + "…" }

    static func email(_ email: String?) -> String {
        guard let email, let at = email.lastIndex(of: "@") else { return email == nil ? "none" : "•••" }
        return String(email.prefix(1)) + "•••" + String(email[at...])
    }
}
