import BrokerCore
import Deliveries
import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// Apple notifications, webhooks, API keys and the audit log: the same stores the JSON API
/// uses (`WebhookSubscriptionStore`, `APIKeyStore`), the console's audit rows beside theirs.
struct OperationsPages {
    let store: ConsoleStore
    let subscriptions: WebhookSubscriptionStore
    let apiKeys: APIKeyStore
    let sessions: ConsoleSessionStore
    /// Keys the hash of a sub under a team, as the notification inbox stores it.
    let hasher: SubjectHasher
    /// The client ids a key may be limited to (`APPLE_CLIENT_IDS` and the app groups' members).
    let clientIDs: Set<String>

    // MARK: Apple notifications

    func notifications(_ request: ConsoleRequest) throws -> HTTPResponse {
        let counts: [[HTML]] = try store.notificationCounts().map { count in
            ["\(count.eventType)", "\(count.outcome)", "\(count.count)", "\(RFC3339Date.string(count.last))"]
        }
        let recent: [[HTML]] = try store.recentNotifications().map { item in
            [
                "\(RFC3339Date.string(item.receivedAt))", "\(item.eventType)", "\(item.outcome)",
                "<code>\(item.subjectHash.map { String($0.prefix(24)) + "…" } ?? "none")</code>",
            ]
        }
        let findings: [[HTML]] = try store.sweepFindings(hasher: hasher).map { finding in
            [
                "\(RFC3339Date.string(finding.foundAt))", "\(finding.userID.lowercasedString)", "\(finding.clientID)",
                "\(finding.appleError ?? "")", "<code>\(String(finding.subjectHash.prefix(24)))…</code>",
            ]
        }
        return Layout.page(
            "Apple notifications", session: request.session,
            """
            \(HTML.table(caption: "Counts by type and outcome", headers: ["Type", "Outcome", "Count", "Last"], rows: counts))
            \(HTML.table(caption: "The 50 most recent (subject by keyed hash only)", headers: ["Received", "Type", "Outcome", "Subject hash"], rows: recent))
            <h2>Refresh-token sweep findings</h2>
            <p>\(findings.count) refresh token(s) Apple called dead (<code>invalid_grant</code>) in the daily sweep with no
            <code>consent-revoked</code> or <code>account-delete</code> notification about the user: the consent is kept
            (a password change also ends a token), the app was asked for a fresh sign-in (<code>token.invalidated</code>).
            Many of them with none of the notifications above may mean the notification endpoint is not reached.</p>
            \(HTML.table(caption: "Newest 100: user id and subject hash only", headers: ["Found", "User id", "Client id", "Apple's error", "Subject hash"], rows: findings))
            """)
    }

    // MARK: Webhooks

    func webhooks(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let mayOperate = session.allows(.webhookOperators)
        let rows: [[HTML]] = try subscriptions.list().map { subscription in
            let json = subscription.json.objectValue ?? [:]
            let id = json["id"]?.stringValue ?? ""
            let status = json["status"]?.stringValue ?? ""
            var actions: [HTML] = []
            if mayOperate {
                let verb = status == "paused" ? "resume" : "pause"
                actions.append(
                    "<form method=\"post\" action=\"/webhooks/\(id)/\(verb)\">\(Layout.csrfField(session))<button type=\"submit\">\(verb.capitalized)</button></form>"
                )
            }
            if session.allows(.admins) { actions.append("<a href=\"/webhooks/\(id)/delete\">Delete…</a>") }
            let topics = (json["topics"]?.arrayValue ?? []).compactMap(\.stringValue).joined(separator: ", ")
            let url = json["url"]?.stringValue ?? ""
            // A receiver's query or user-info may hold its secret: shown whole to admins only.
            let shown = session.allows(.admins) ? url : Self.maskedURL(url)
            return ["\(id)", "\(shown)", "\(topics)", "\(status)", HTML.join(actions)]
        }
        let failed: [[HTML]] = try subscriptions.deliveries(state: .failed, ownedBy: nil).prefix(100).map { value in
            let json = value.objectValue ?? [:]
            let id = json["id"]?.integerValue.map(String.init) ?? ""
            let retry: HTML =
                mayOperate
                ? "<form method=\"post\" action=\"/webhooks/deliveries/\(id)/retry\">\(Layout.csrfField(session))<button type=\"submit\">Retry</button></form>"
                : .empty
            return [
                "\(id)", "\(json["type"]?.stringValue ?? "")", "\(json["subscription_id"]?.stringValue ?? "")",
                "\(json["attempts"]?.integerValue.map(String.init) ?? "")", "\(json["last_error"]?.stringValue ?? "")", retry,
            ]
        }
        let create: HTML =
            session.allows(.admins)
            ? """
            <h2>New subscription</h2><form method="post" action="/webhooks">\(Layout.csrfField(session))
            <label for="url">Receiver URL (https)</label><input id="url" name="url" type="url" required maxlength="2048">
            <label for="topics">Topics (comma-separated, e.g. user.deleted)</label><input id="topics" name="topics" required maxlength="500">
            <label for="description">Description</label><input id="description" name="description" maxlength="200">
            <button type="submit">Create the subscription</button></form>
            """
            : .empty
        return Layout.page(
            "Webhooks", session: session,
            """
            \(HTML.table(caption: "Subscriptions", headers: ["Id", "URL", "Topics", "Status", "Actions"], rows: rows))
            \(create)
            \(HTML.table(caption: "Dead letters (failed deliveries, newest first)", headers: ["Delivery", "Event", "Subscription", "Attempts", "Last error", ""], rows: failed))
            """)
    }

    /// Creates a subscription through the store the events API uses; its signing secret is
    /// shown this once.
    func createSubscription(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let topicList = try request.field("topics", maximum: 500).split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespaces)
        }.filter { !$0.isEmpty }
        let description = request.form["description"].flatMap { $0.isEmpty ? nil : String($0.prefix(200)) }
        let secret: String
        do {
            let url = try subscriptions.validate(url: try request.field("url", maximum: 2048))
            secret = try subscriptions.create(
                url: url, topics: try WebhookSubscriptionStore.validate(topics: topicList), description: description,
                actor: session.actor
            ).1
        } catch let error as BrokerError {
            throw ConsoleRefusal.invalid(error.detail)
        }
        return Layout.page(
            "Subscription created", session: session, status: 201,
            """
            <p>Copy the signing secret now: it is shown this once.</p>
            <p><code class="code">\(secret)</code></p><p><a href="/webhooks">Back to the webhooks</a></p>
            """)
    }

    func pause(_ request: ConsoleRequest) throws -> HTTPResponse { try setStatus(request, .paused) }
    func resume(_ request: ConsoleRequest) throws -> HTTPResponse { try setStatus(request, .active) }

    private func setStatus(_ request: ConsoleRequest, _ status: SubscriptionStatus) throws -> HTTPResponse {
        let session = try request.signedIn
        guard try subscriptions.setStatus(try subscriptionID(request), status, actor: session.actor) else {
            throw ConsoleRefusal.notFound
        }
        return Layout.redirect("/webhooks")
    }

    func deleteConfirm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let id = try subscriptionID(request)
        guard let subscription = try subscriptions.find(id), let json = subscription.json.objectValue else {
            throw ConsoleRefusal.notFound
        }
        return Layout.page(
            "Delete subscription", session: session,
            """
            <p>Deleting the subscription to <strong>\(json["url"]?.stringValue ?? "")</strong> drops its queued and failed
            deliveries: its receiver is told nothing more, <code>user.deleted</code> included.</p>
            <form method="post" action="/webhooks/\(id.lowercasedString)/delete">\(Layout.csrfField(session))
            <button type="submit" class="danger">Delete the subscription</button></form><p><a href="/webhooks">Cancel</a></p>
            """)
    }

    func delete(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        guard try subscriptions.delete(try subscriptionID(request), actor: session.actor) else { throw ConsoleRefusal.notFound }
        return Layout.redirect("/webhooks")
    }

    func redrive(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        guard let id = request.http.pathParameters["id"].flatMap({ Int64($0) }) else { throw ConsoleRefusal.notFound }
        // Audited by the store (`webhook_delivery.retried`), with the operator as actor.
        guard try subscriptions.redrive(delivery: id, ownedBy: nil, actor: session.actor) else {
            return Layout.refusal(409, "Cannot retry", "Only a failed delivery can be retried.", session: session)
        }
        return Layout.redirect("/webhooks")
    }

    /// A webhook URL with its user-info and query masked (`https://•••@host/path?•••`): what
    /// every role but admin sees of a receiver.
    static func maskedURL(_ url: String) -> String {
        guard let components = URLComponents(string: url), let scheme = components.scheme, let host = components.host else {
            return "•••"
        }
        let userInfo = components.user != nil || components.password != nil ? "•••@" : ""
        let port = components.port.map { ":\($0)" } ?? ""
        let query = components.query != nil ? "?•••" : ""
        let bracketed = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return "\(scheme)://\(userInfo)\(bracketed)\(port)\(components.percentEncodedPath)\(query)"
    }

    private func subscriptionID(_ request: ConsoleRequest) throws -> UUID {
        guard let id = request.http.pathParameters["id"].flatMap(UUID.init(uuidString:)) else { throw ConsoleRefusal.notFound }
        return id
    }

    // MARK: API keys

    func apiKeys(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let mayRevoke = session.allows(.webhookOperators)
        let rows: [[HTML]] = try apiKeys.list().map { key in
            let state: HTML =
                if let revoked = key.revokedAt {
                    "revoked \(RFC3339Date.string(revoked))"
                } else if mayRevoke {
                    "<a href=\"/api-keys/\(key.id)/revoke\">Revoke…</a>"
                } else {
                    "active"
                }
            return [
                "\(key.id)", "\(key.name)", "\(key.scopes.sorted().map(\.rawValue).joined(separator: ", "))",
                "\(key.clientIDs?.joined(separator: ", ") ?? "every app")", "\(RFC3339Date.string(key.createdAt))", state,
            ]
        }
        let grantable = Scope.allCases.filter { session.roles.contains($0.consoleRole) }.map(\.rawValue)
        let create: HTML =
            session.allows(.keyCreators)
            ? """
            <h2>New key</h2><form method="post" action="/api-keys">\(Layout.csrfField(session))
            <label for="name">Name</label><input id="name" name="name" required maxlength="100">
            <label for="scopes">Scopes (comma-separated; your roles allow: \(grantable.joined(separator: ", ")))</label>
            <input id="scopes" name="scopes" required maxlength="100">
            <label for="client_ids">Limit to client ids (comma-separated; empty: every app)</label>
            <input id="client_ids" name="client_ids" maxlength="2000">
            <button type="submit">Create the key</button></form>
            """
            : .empty
        return Layout.page(
            "API keys", session: session,
            "\(HTML.table(caption: "Keys (never the secret)", headers: ["Id", "Name", "Scopes", "Apps", "Created", "State"], rows: rows))\(create)"
        )
    }

    /// Creates a key and shows it this once (never stored in clear, never shown again): only
    /// with scopes the operator's roles cover (`Scope.consoleRole`), else 403 with nothing
    /// written but the refusal's audit row; optionally limited to some client ids.
    func createKey(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let name = try request.field("name", maximum: 100)
        guard let scopes = Scope.parseList(try request.field("scopes", maximum: 100)), !scopes.isEmpty else {
            throw ConsoleRefusal.invalid("Name scopes from: \(Scope.allCases.map(\.rawValue).joined(separator: ", ")).")
        }
        let limited = (request.form["client_ids"] ?? "").split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespaces)
        }.filter { !$0.isEmpty }
        guard limited.count <= 50, (request.form["client_ids"] ?? "").utf8.count <= 2000 else {
            throw ConsoleRefusal.invalid("Limit a key to at most 50 client ids.")
        }
        if let unknown = limited.first(where: { !clientIDs.contains($0) }) {
            throw ConsoleRefusal.invalid(
                "\(unknown) is not one of the broker’s client ids (\(clientIDs.sorted().joined(separator: ", "))).")
        }
        let scopeText = scopes.sorted().map(\.rawValue).joined(separator: ",")
        let uncovered = scopes.filter { !session.roles.contains($0.consoleRole) }.sorted()
        guard uncovered.isEmpty else {
            try sessions.audit(
                actor: session.actor, action: "api_key.created", target: "api_key", outcome: .refused,
                detail: ["scopes": .string(scopeText), "reason": "scope_not_covered_by_role"])
            let needed = Set(uncovered.map(\.consoleRole)).sorted().map(\.rawValue).joined(separator: " or ")
            throw ConsoleRefusal(
                status: 403, code: "console_forbidden", title: "Not allowed",
                message:
                    "A key with \(uncovered.map(\.rawValue).joined(separator: ", ")) needs the \(needed) role, which yours do not include."
            )
        }
        let created = try apiKeys.create(
            name: name, scopes: scopes, clientIDs: limited.isEmpty ? nil : Array(Set(limited)).sorted(), actor: session.actor)
        return Layout.page(
            "API key created", session: session, status: 201,
            """
            <p>Copy the key now: it is shown this once and cannot be shown again.</p>
            <p><code class="code">\(created.secret)</code></p><p><a href="/api-keys">Back to the keys</a></p>
            """)
    }

    func revokeConfirm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let id = try keyID(request)
        guard let key = try apiKeys.list().first(where: { $0.id == id && $0.revokedAt == nil }) else {
            throw ConsoleRefusal.notFound
        }
        return Layout.page(
            "Revoke API key", session: session,
            """
            <p>Every request with the key <strong>\(key.name)</strong> (\(key.id)) is refused from now on, on every replica.</p>
            <form method="post" action="/api-keys/\(key.id)/revoke">\(Layout.csrfField(session))
            <button type="submit" class="danger">Revoke the key</button></form><p><a href="/api-keys">Cancel</a></p>
            """)
    }

    func revoke(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        guard try apiKeys.revoke(id: try keyID(request), actor: session.actor) else { throw ConsoleRefusal.notFound }
        return Layout.redirect("/api-keys")
    }

    private func keyID(_ request: ConsoleRequest) throws -> String {
        guard let id = request.http.pathParameters["id"], id.utf8.count <= 40 else { throw ConsoleRefusal.notFound }
        return id
    }

    // MARK: Audit

    private func filter(_ request: ConsoleRequest) throws -> ConsoleStore.AuditFilter {
        func value(_ name: String) -> String? {
            request.http.query[name].flatMap { $0.isEmpty ? nil : String($0.prefix(200)) }
        }
        for name in Self.filterNames {
            if let text = request.http.query[name], ConsoleGate.hasControlCharacters(text) { throw ConsoleGate.refusedControl }
        }
        var filter = ConsoleStore.AuditFilter(actor: value("actor"), action: value("action"), subject: value("subject"))
        if let text = value("deletion_id") {
            guard let id = UUID(uuidString: text) else { throw ConsoleRefusal.invalid("The deletion id is not a UUID.") }
            filter.deletionID = id
        }
        if let text = value("from") {
            guard let day = RFC3339Date.day(text) else { throw ConsoleRefusal.invalid("Give dates as YYYY-MM-DD.") }
            filter.from = day
        }
        if let text = value("to") {
            guard let day = RFC3339Date.day(text) else { throw ConsoleRefusal.invalid("Give dates as YYYY-MM-DD.") }
            filter.to = day.addingTimeInterval(86_400)
        }
        return filter
    }

    static let filterNames = ["action", "actor", "deletion_id", "from", "subject", "to"]

    /// The audit filter of a request as a query string: its known fields only, each as the
    /// filter uses it (at most 200 characters), so neither a link nor the export's own audit
    /// row carries whatever else the URL held.
    static func filterQuery(_ request: ConsoleRequest, encoded: Bool = true) -> String {
        filterNames.compactMap { name in
            request.http.query[name].flatMap { value in
                guard !value.isEmpty else { return nil }
                let text = String(value.prefix(200))
                return "\(name)=\(encoded ? ConsoleGate.percentEncoded(text) : text)"
            }
        }.joined(separator: "&")
    }

    func audit(_ request: ConsoleRequest) throws -> HTTPResponse {
        let filter = try filter(request)
        let entries = try store.audit(filter, limit: 200)
        let rows: [[HTML]] = entries.map { entry in
            [
                "\(RFC3339Date.string(entry.at))", "\(entry.actor)", "\(entry.action)", "\(entry.target ?? "")",
                "\(entry.outcome ?? "")", "\(entry.subject ?? "")", "\(entry.deletionID?.lowercasedString ?? "")",
                "<code>\(entry.detail)</code>",
            ]
        }
        let query = Self.filterQuery(request)
        func field(_ name: String, _ label: String, _ type: String = "text") -> HTML {
            "<label for=\"\(name)\">\(label)</label><input id=\"\(name)\" name=\"\(name)\" type=\"\(type)\" value=\"\(request.http.query[name] ?? "")\">"
        }
        return Layout.page(
            "Audit log", session: request.session,
            """
            <form method="get" action="/audit">\(field("actor", "Actor"))\(field("action", "Action"))\(field("subject", "Subject"))
            \(field("deletion_id", "Deletion id"))\(field("from", "From", "date"))\(field("to", "To", "date"))
            <button type="submit">Filter</button></form>
            <p>Export these entries (up to 10,000; the export is audited):
            <a href="/audit/export?format=csv\(query.isEmpty ? "" : "&" + query)">CSV</a> ·
            <a href="/audit/export?format=jsonl\(query.isEmpty ? "" : "&" + query)">JSON lines</a></p>
            \(HTML.table(caption: "Newest 200 entries", headers: ["At", "Actor", "Action", "Target", "Outcome", "Subject", "Deletion", "Detail"], rows: rows))
            """)
    }

    func auditExport(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let format = request.http.query["format"] ?? "csv"
        guard format == "csv" || format == "jsonl" else { throw ConsoleRefusal.invalid("Export as csv or jsonl.") }
        let filter = try filter(request)
        let entries = try store.audit(filter, limit: 10_000)
        try sessions.audit(
            actor: session.actor, action: "console.audit_exported", target: "audit_log",
            detail: [
                "format": .string(format), "entries": .integer(Int64(entries.count)),
                "filter": .string(Self.filterQuery(request, encoded: false)),
            ])
        var text = ""
        if format == "csv" {
            func cell(_ value: String) -> String {
                // A leading =, +, - or @ would be a formula in a spreadsheet.
                let safe = value.first.map { "=+-@".contains($0) } == true ? "'" + value : value
                return "\"" + safe.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            }
            // target and outcome (sql/0025) come last: readers of the earlier columns are unchanged.
            text = "id,at,actor,action,subject,deletion_id,detail,target,outcome\r\n"
            for entry in entries {
                text +=
                    [
                        String(entry.id), RFC3339Date.string(entry.at), entry.actor, entry.action, entry.subject ?? "",
                        entry.deletionID?.lowercasedString ?? "", entry.detail, entry.target ?? "", entry.outcome ?? "",
                    ].map(cell).joined(separator: ",") + "\r\n"
            }
        } else {
            for entry in entries {
                var object: [String: JSONValue] = [
                    "id": .integer(entry.id), "at": .string(RFC3339Date.string(entry.at)), "actor": .string(entry.actor),
                    "action": .string(entry.action),
                ]
                object["target"] = entry.target.map(JSONValue.string) ?? .null
                object["outcome"] = entry.outcome.map(JSONValue.string) ?? .null
                object["subject"] = entry.subject.map(JSONValue.string) ?? .null
                object["deletion_id"] = entry.deletionID.map { .string($0.lowercasedString) } ?? .null
                object["detail"] = (try? JSONValue.parse(Array(entry.detail.utf8))) ?? .string(entry.detail)
                text += String(decoding: JSONValue.object(object).serialized(), as: UTF8.self) + "\n"
            }
        }
        var response = HTTPResponse.text(
            text, contentType: format == "csv" ? "text/csv; charset=utf-8" : "application/jsonl; charset=utf-8")
        response.headers.set("Content-Disposition", "attachment; filename=\"audit.\(format)\"")
        return response
    }
}
