import Foundation

/// The console's settings (docs/configuration.md, "Console"), read from the environment in one
/// pass like `BrokerConfiguration`: every problem reported at once. `BROKER_CONSOLE_LISTEN`
/// unset means no console at all.
public struct ConsoleConfiguration: Sendable {
    /// `BROKER_CONSOLE_LISTEN`, `host:port`: the console's own listener, never the API's.
    public var listen: String
    /// `BROKER_CONSOLE_URL`: the console's address as operators' browsers reach it (sign-in
    /// links and the OIDC redirect URI are built from it). Default `http://<listen>`.
    public var publicURL: String
    /// `BROKER_CONSOLE_SESSION_IDLE_SECONDS` (default 1800) and
    /// `BROKER_CONSOLE_SESSION_MAX_SECONDS` (default 8 h): a session ends after that long
    /// without a request, or that long after sign-in, whichever comes first.
    public var sessionIdle: Duration = .seconds(1800)
    public var sessionMaximum: Duration = .seconds(8 * 3600)
    /// `BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS` (default 7 days): the overview warns
    /// when an app (or the whole broker) has received no Apple notification for longer: "no
    /// traffic at all" is usually the endpoint's TLS or registration (DTS, forum threads
    /// 811848, 830681). Apple sends one per event, so a quiet app may need it longer.
    public var notificationSilence: Duration = .seconds(7 * 86_400)
    /// How recent a proof of identity must be for a step-up route (5 minutes, issue 30).
    public var stepUpWindow: Duration = .seconds(300)
    /// Sign-in link redemptions per client address: bursts of 10, then one every 6 s.
    public var linkRedemptionsPerSecond = 1.0 / 6
    /// Sign-ins under way kept at once (`console_oidc_transactions`), from every address
    /// together: anyone can start one, and the per-address budget alone does not bound the
    /// table against many addresses.
    public var oidcTransactionLimit = 10_000
    /// Audit rows for failed sign-ins (`console.sign_in_refused`), for all addresses together:
    /// bursts of this many, then one every 10 s; the failures beyond are counted into the next
    /// row (`SignInFailures`), so anyone failing sign-ins cannot grow the append-only log.
    public var failedSignInAuditBurst = 60
    public var failedSignInAuditsPerSecond = 0.1
    public var oidc: OIDC?

    /// The organisation's OpenID Connect provider, when operators sign in through one.
    public struct OIDC: Sendable {
        /// `CONSOLE_OIDC_ISSUER`: compared exactly with `iss`; discovery is read from
        /// `<issuer>/.well-known/openid-configuration`.
        public var issuer: String
        /// `CONSOLE_OIDC_CLIENT_ID` (the ID token's `aud`) and `CONSOLE_OIDC_CLIENT_SECRET`.
        public var clientID: String
        public var clientSecret: String
        /// `CONSOLE_OIDC_GROUPS_CLAIM`: the claim listing the operator's groups (default `groups`).
        public var groupsClaim: String = "groups"
        /// `CONSOLE_OIDC_ROLE_MAP`: `group=role,…`, e.g. `ops=operator,dpo=compliance`.
        public var roleMap: [String: Set<ConsoleRole>]

        /// The roles these groups map to (CONSOLE_OIDC_ROLE_MAP).
        func roles(of groups: [String]) -> Set<ConsoleRole> {
            groups.reduce(into: Set<ConsoleRole>()) { $0.formUnion(roleMap[$1] ?? []) }
        }

        public init(
            issuer: String, clientID: String, clientSecret: String, groupsClaim: String = "groups",
            roleMap: [String: Set<ConsoleRole>]
        ) {
            self.issuer = issuer
            self.clientID = clientID
            self.clientSecret = clientSecret
            self.groupsClaim = groupsClaim
            self.roleMap = roleMap
        }
    }

    public struct Invalid: Error, CustomStringConvertible {
        public let problems: [String]
        public var description: String { problems.joined(separator: "\n") }
    }

    public init(listen: String, publicURL: String? = nil) {
        self.listen = listen
        self.publicURL = publicURL ?? "http://\(listen)"
    }

    /// nil when `BROKER_CONSOLE_LISTEN` is unset.
    /// - Parameter apiListen: `BROKER_LISTEN`, which the console must not share.
    public static func load(environment: [String: String], apiListen: String) throws -> ConsoleConfiguration? {
        func value(_ name: String) -> String? {
            guard let text = environment[name]?.trimmingCharacters(in: .whitespacesAndNewlines), !text.isEmpty else {
                return nil
            }
            return text
        }
        var problems: [String] = []
        func integer(_ name: String, in range: ClosedRange<Int>) -> Int? {
            guard let text = value(name) else { return nil }
            guard let number = Int(text), range.contains(number) else {
                problems.append("\(name): expected a whole number from \(range.lowerBound) to \(range.upperBound), got '\(text)'")
                return nil
            }
            return number
        }
        func seconds(_ name: String, in range: ClosedRange<Int>) -> Duration? { integer(name, in: range).map { .seconds($0) } }
        guard let listen = value("BROKER_CONSOLE_LISTEN") else {
            let stray = environment.keys.filter { $0.hasPrefix("CONSOLE_OIDC_") || $0.hasPrefix("BROKER_CONSOLE_") }.sorted()
            if !stray.isEmpty { throw Invalid(problems: ["\(stray[0]): set BROKER_CONSOLE_LISTEN too, or the console is off"]) }
            return nil
        }
        if !listen.contains(":") || listen == apiListen {
            problems.append("BROKER_CONSOLE_LISTEN: expected host:port other than BROKER_LISTEN, got '\(listen)'")
        }
        var configuration = ConsoleConfiguration(listen: listen, publicURL: value("BROKER_CONSOLE_URL"))
        if let url = value("BROKER_CONSOLE_URL"), !(url.hasPrefix("https://") || url.hasPrefix("http://")) || url.hasSuffix("/") {
            problems.append("BROKER_CONSOLE_URL: expected an http(s) URL without a trailing slash, got '\(url)'")
        }
        configuration.sessionIdle =
            seconds("BROKER_CONSOLE_SESSION_IDLE_SECONDS", in: 60...86_400) ?? configuration.sessionIdle
        configuration.sessionMaximum =
            seconds("BROKER_CONSOLE_SESSION_MAX_SECONDS", in: 300...(7 * 86_400)) ?? configuration.sessionMaximum
        configuration.notificationSilence =
            seconds("BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS", in: 3600...(365 * 86_400))
            ?? configuration.notificationSilence
        let issuer = value("CONSOLE_OIDC_ISSUER")
        let clientID = value("CONSOLE_OIDC_CLIENT_ID")
        let secret = value("CONSOLE_OIDC_CLIENT_SECRET")
        if issuer != nil || clientID != nil || secret != nil {
            if issuer == nil { problems.append("CONSOLE_OIDC_ISSUER: missing (the other CONSOLE_OIDC_ settings are set)") }
            if clientID == nil { problems.append("CONSOLE_OIDC_CLIENT_ID: missing") }
            if secret == nil { problems.append("CONSOLE_OIDC_CLIENT_SECRET: missing") }
            var roleMap: [String: Set<ConsoleRole>] = [:]
            for entry in (value("CONSOLE_OIDC_ROLE_MAP") ?? "").split(separator: ",") {
                let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                guard parts.count == 2, !parts[0].isEmpty, let role = ConsoleRole(rawValue: parts[1]) else {
                    problems.append(
                        "CONSOLE_OIDC_ROLE_MAP: expected group=role entries (roles: viewer, operator, compliance, admin), got '\(entry)'"
                    )
                    continue
                }
                roleMap[parts[0], default: []].insert(role)
            }
            if roleMap.isEmpty { problems.append("CONSOLE_OIDC_ROLE_MAP: map at least one group to a role") }
            if let issuer, let clientID, let secret {
                configuration.oidc = OIDC(
                    issuer: issuer, clientID: clientID, clientSecret: secret,
                    groupsClaim: value("CONSOLE_OIDC_GROUPS_CLAIM") ?? "groups", roleMap: roleMap)
            }
        }
        if !problems.isEmpty { throw Invalid(problems: problems) }
        return configuration
    }
}
