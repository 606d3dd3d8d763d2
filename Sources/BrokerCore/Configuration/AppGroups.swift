import Foundation

/// Which client ids share one authorization at Apple.
///
/// Apple scopes a user's consent to a **primary App ID**: an app together with the App IDs
/// and Services IDs grouped under it. Server-to-server notifications name the primary App ID
/// in `aud`, and Apple's engineers say to route each event by it (protocol reference §10.2;
/// forums 655485, 809509, 807645). So a `consent-revoked` for one group must leave another
/// group's grant and refresh tokens alone.
///
/// `APPLE_APP_GROUPS`: `primary=member,member;primary2` (for example
/// `com.example.app=com.example.web,com.example.mac;com.other.app`). Unset, every client id of
/// `APPLE_CLIENT_IDS` forms one group whose primary is the first (one app and its web
/// Services ID). A client id in no group is a group of its own.
public struct AppGroups: Sendable, Equatable {
    /// One primary App ID and the client ids grouped under it.
    public struct Group: Sendable, Hashable {
        /// The primary App ID: how the group is named in storage, events and notifications.
        public let primary: String
        /// Every client id of the group, the primary first.
        public let clientIDs: [String]
    }

    public let groups: [Group]
    private let indexByClientID: [String: Int]

    public init(groups: [Group]) {
        self.groups = groups
        var index: [String: Int] = [:]
        for (position, group) in groups.enumerated() {
            for clientID in group.clientIDs { index[clientID] = position }
        }
        indexByClientID = index
    }

    /// All client ids in one group, the first one primary.
    public static func single(_ clientIDs: [String]) -> AppGroups {
        guard let first = clientIDs.first else { return AppGroups(groups: []) }
        return AppGroups(groups: [Group(primary: first, clientIDs: [first] + clientIDs.dropFirst().filter { $0 != first })])
    }

    /// The group of a client id; an unknown one is a group of its own.
    public func group(of clientID: String) -> Group {
        indexByClientID[clientID].map { groups[$0] } ?? Group(primary: clientID, clientIDs: [clientID])
    }

    /// Every client id any group names (primaries included): the audiences a notification may carry.
    public var allClientIDs: Set<String> { Set(indexByClientID.keys) }

    /// Parses `APPLE_APP_GROUPS` against `APPLE_CLIENT_IDS`.
    /// - Returns: the groups, or the problems found (each naming the variable).
    static func parse(_ text: String?, clientIDs: [String]) -> Result<AppGroups, Problems> {
        guard let text else { return .success(.single(clientIDs)) }
        var problems: [String] = []
        var groups: [Group] = []
        var seen = Set<String>()
        for entry in text.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespaces) }) where !entry.isEmpty {
            let parts = entry.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                .map { $0.trimmingCharacters(in: .whitespaces) }
            let primary = parts[0]
            let members =
                parts.count > 1
                ? parts[1].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty } : []
            guard !primary.isEmpty, parts.count == 1 || !members.isEmpty else {
                problems.append("APPLE_APP_GROUPS: expected primary=member,member entries separated by ';', got '\(entry)'")
                continue
            }
            // A primary may be outside APPLE_CLIENT_IDS when it only names the group (a web-only
            // deployment still receives notifications for the app's primary App ID); members
            // and lone primaries must be client ids the broker accepts tokens for.
            for clientID in members where !clientIDs.contains(clientID) {
                problems.append("APPLE_APP_GROUPS: \(clientID) is not one of APPLE_CLIENT_IDS")
            }
            if members.isEmpty && !clientIDs.contains(primary) {
                problems.append("APPLE_APP_GROUPS: \(primary) is not one of APPLE_CLIENT_IDS")
            }
            let group = Group(primary: primary, clientIDs: [primary] + members.filter { $0 != primary })
            for clientID in group.clientIDs where !seen.insert(clientID).inserted {
                problems.append("APPLE_APP_GROUPS: \(clientID) is in more than one group")
            }
            groups.append(group)
        }
        if groups.isEmpty { problems.append("APPLE_APP_GROUPS: no group given") }
        guard problems.isEmpty else { return .failure(Problems(messages: problems)) }
        // A client id in no group is a group of its own.
        for clientID in clientIDs where !seen.contains(clientID) {
            groups.append(Group(primary: clientID, clientIDs: [clientID]))
        }
        return .success(AppGroups(groups: groups))
    }

    /// What is wrong with an `APPLE_APP_GROUPS` value.
    struct Problems: Error {
        let messages: [String]
    }

    public static func == (lhs: AppGroups, rhs: AppGroups) -> Bool { lhs.groups == rhs.groups }
}
