import BrokerCore
import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// Follow-ups (TN3194 manual revocations, failed revocations, notifications after a
/// deletion) and the exact-match lookup with its audited reveal.
struct FollowUpPages {
    let store: ConsoleStore
    let finder: ExactLookup

    static let manualWording =
        "We deleted your account. To finish, open Settings › [your name] › Sign-In & Security › Sign in with Apple, "
        + "choose the app and tap “Stop Using Apple ID”."

    func followUps(_ request: ConsoleRequest) throws -> HTTPResponse {
        let manual = try store.manualRevocations()
        let failed = try store.failedRevocations()
        let late = try store.notificationsAfterDeletion()
        func link(_ id: UUID) -> HTML { "<a href=\"/deletions/\(id.lowercasedString)\">\(id.lowercasedString)</a>" }
        let manualRows: [[HTML]] = manual.map { item in
            let closed: HTML? = item.closedAt.map { at in
                switch item.closedBy {
                case "retention": "closed: a dormant user's deletion, nobody to ask (\(RFC3339Date.string(at)))"
                case "account-delete": "closed: the user deleted the Apple Account (\(RFC3339Date.string(at)))"
                default: "closed: the user revoked at Apple (\(RFC3339Date.string(at)))"
                }
            }
            return [
                link(item.deletionID), "\(item.appID ?? "(every app: decided by an earlier release)")",
                "\(item.completedAt.map(RFC3339Date.string) ?? "")",
                closed ?? "<strong>open</strong>: ask the user to stop using Sign in with Apple for this app",
            ]
        }
        let failedRows: [[HTML]] = failed.map { item in
            [link(item.deletionID), "\(item.clientID ?? "")", "\(item.outcome)", "\(RFC3339Date.string(item.at))"]
        }
        let lateRows: [[HTML]] = late.map { item in
            [link(item.deletionID), "\(item.eventType)", "\(item.outcome)", "\(RFC3339Date.string(item.receivedAt))"]
        }
        return Layout.page(
            "Follow-ups", session: request.session,
            """
            <h2>Manual revocation required (TN3194)</h2>
            <p>For each of these deletions and app groups the broker held no live token Apple could revoke (none stored, or
            each one dead: a password change kills a refresh token and leaves the authorization). Revoking ends one app
            group’s authorization only, so each group is its own follow-up. Until the user stops using Sign in with Apple
            for the app, a new sign-in skips the name and e-mail sheet. Wording to send:</p>
            <blockquote>\(Self.manualWording)</blockquote>
            <p class="hint">A follow-up closes by itself, for good, when Apple later sends consent-revoked for the same user
            and app group (newer than the user's last sign-in) or account-delete for the user.</p>
            \(HTML.table(caption: "\(manual.filter { $0.closedAt == nil }.count) open of \(manual.count)", headers: ["Deletion", "App group", "Completed", "Follow-up"], rows: manualRows))
            <h2>Failed revocations</h2>
            \(HTML.table(caption: "Failed deletions whose last revocation did not succeed", headers: ["Deletion", "Client id", "Outcome", "At"], rows: failedRows))
            <h2>Notifications after a deletion</h2>
            \(HTML.table(caption: "Apple notifications about a deleted user", headers: ["Deletion", "Event", "Outcome", "Received"], rows: lateRows))
            """)
    }

    // MARK: Lookup

    func lookupForm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        return Layout.page(
            "Lookup", session: session,
            """
            <p>Find a user by one exact value: no pattern, no list. Every lookup is audited (a keyed hash of the value).</p>
            <form method="post" action="/lookup">\(Layout.csrfField(session))\(ExactLookup.fields("Look up by"))
            <button type="submit">Look up</button></form>
            """)
    }

    func lookup(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        let (kind, users) = try finder.find(request, by: session)
        var sections: [HTML] = []
        for user in users {
            let rows: [[HTML]] = try store.identities(of: user).map { identity in
                let flags =
                    identity.email == nil
                    ? ""
                    : (identity.emailVerified ? "verified" : "unverified") + (identity.isPrivateEmail ? ", private relay" : "")
                let reveal: HTML =
                    identity.email == nil
                    ? "none"
                    : """
                    \(Masking.email(identity.email)) (\(flags))
                    <form method="post" action="/lookup/reveal">\(Layout.csrfField(session))
                    <input type="hidden" name="user_id" value="\(user.lowercasedString)"><input type="hidden" name="apple_sub" value="\(finder.termHash(identity.sub))">
                    <button type="submit">Reveal</button></form>
                    """
                return ["\(Masking.sub(identity.sub))", "\(identity.clientID)", reveal, "\(identity.consent)"]
            }
            sections.append(
                "<h2>User \(user.lowercasedString)</h2>"
                    + HTML.table(
                        caption: "Apple identities (masked)", headers: ["Apple sub", "Last signed in with", "E-mail", "Consent"],
                        rows: rows
                    ))
        }
        let lead: HTML =
            kind == "email" && !users.isEmpty
            ? "<p class=\"refusal\">An e-mail match is a lead, not proof of identity: an unverified address may not be the user’s.</p>"
            : .empty
        return Layout.page(
            "Lookup result", session: session,
            users.isEmpty ? "<p>No user matches.</p><p><a href=\"/lookup\">New lookup</a></p>" : lead + HTML.join(sections))
    }

    /// Shows one identity's e-mail after a recent sign-in; audited with the user, never the address.
    func reveal(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        guard let user = UUID(uuidString: try request.field("user_id", maximum: 36)) else {
            throw ConsoleRefusal.invalid("The user id is not a UUID.")
        }
        // The result page names an identity by the keyed hash of its sub, so the page's source holds
        // no more than its masked table; a sub typed by hand is still accepted.
        let named = try request.field("apple_sub", maximum: 256)
        guard let sub = try store.identities(of: user).map(\.sub).first(where: { $0 == named || finder.termHash($0) == named }),
            let email = try store.email(userID: user, sub: sub)
        else { throw ConsoleRefusal.notFound }
        try store.pool.withConnection { connection in
            try ConsoleSessionStore.audit(
                connection, actor: session.actor, action: "console.reveal", target: "user:\(user.lowercasedString)",
                subject: user.lowercasedString,
                detail: ["field": "email", "sub_hash": .string(finder.termHash(sub))])
        }
        return Layout.page(
            "Revealed", session: session,
            "<dl><dt>User</dt><dd>\(user.lowercasedString)</dd><dt>E-mail</dt><dd>\(email)</dd></dl><p class=\"hint\">This reveal is in the audit log.</p>"
        )
    }
}
