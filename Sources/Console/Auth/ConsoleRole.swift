import BrokerCore

/// What an operator may do in the console (docs/console.md, "Roles"). Rights are not a
/// ladder: compliance and admin are separate duties (admin sees no personal data unless also
/// compliance), so each route names the roles it admits.
public enum ConsoleRole: String, Sendable, CaseIterable, Comparable {
    case viewer, `operator`, compliance, admin

    public static func < (lhs: ConsoleRole, rhs: ConsoleRole) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }
}

extension Set where Element == ConsoleRole {
    /// Every signed-in operator.
    static let everyone: Set<ConsoleRole> = Set(ConsoleRole.allCases)
    static let compliance: Set<ConsoleRole> = [.compliance]
    /// Who may retry a failed deletion: its operators and the compliance team.
    static let retriers: Set<ConsoleRole> = [.`operator`, .compliance]
    static let auditors: Set<ConsoleRole> = [.compliance, .admin]
    /// Pause, resume and re-drive webhooks; list and revoke API keys.
    static let webhookOperators: Set<ConsoleRole> = [.`operator`, .admin]
    /// Create API keys, delete webhook subscriptions.
    static let admins: Set<ConsoleRole> = [.admin]
    /// Create API keys: each key only with the scopes its creator's roles cover (`Scope.consoleRole`).
    static let keyCreators: Set<ConsoleRole> = [.compliance, .admin]
    /// See the API keys: those who revoke them and those who create them.
    static let keyViewers: Set<ConsoleRole> = [.`operator`, .compliance, .admin]
}

extension Scope {
    /// The console role whose duty a key of this scope serves, and so the role an operator
    /// needs to create one (issue 38, item 1): reading users' personal data, deleting users and
    /// logging users in are the compliance team's business (an `admin`, who sees no personal
    /// data in the console, must not mint a key that reads it); events and webhook
    /// administration are the administrators'.
    public var consoleRole: ConsoleRole {
        switch self {
        case .read, .compliance, .login: .compliance
        case .events, .admin: .admin
        }
    }
}
