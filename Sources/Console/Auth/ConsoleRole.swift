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
}
