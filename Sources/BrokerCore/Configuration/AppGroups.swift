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
/// `com.example.app=com.example.web,com.example.mac;com.other.app`). A client id in no group is
/// a group of its own. With more than one client id in `APPLE_CLIENT_IDS` it is required: apps
/// of one team are not one app group by default (protocol reference §12.6), and guessing
/// either way is wrong for someone. Lumping them together made one app's `consent-revoked`
/// revoke the others; splitting them would leave a grouped Services ID's sessions alive after
/// the group's revocation. So the broker refuses to start and names the variable.
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

    /// Each client id a group of its own.
    public static func separate(_ clientIDs: [String]) -> AppGroups {
        var seen = Set<String>()
        return AppGroups(
            groups: clientIDs.filter { seen.insert($0).inserted }.map { Group(primary: $0, clientIDs: [$0]) })
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
        guard let text else {
            guard Set(clientIDs).count > 1 else { return .success(.separate(clientIDs)) }
            return .failure(Problems(messages: [Self.missingMessage(clientIDs)]))
        }
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

    /// Why the broker will not guess the groups of several client ids.
    static func missingMessage(_ clientIDs: [String]) -> String {
        let example = clientIDs.count == 2 ? "\(clientIDs[0])=\(clientIDs[1])" : "\(clientIDs[0])=\(clientIDs[1]);\(clientIDs[2])"
        return "APPLE_APP_GROUPS: missing; APPLE_CLIENT_IDS names \(clientIDs.count) client ids, and the broker does not guess"
            + " which of them share one authorization at Apple (a primary App ID and the IDs grouped under it in"
            + " Certificates, Identifiers & Profiles; consent is revoked per group). Set it as primary=member,member;other,"
            + " e.g. APPLE_APP_GROUPS='\(example)', or '\(clientIDs.joined(separator: ";"))' when every app stands alone"
            + " (docs/configuration.md)"
    }

    /// What is wrong with an `APPLE_APP_GROUPS` value.
    struct Problems: Error {
        let messages: [String]
    }

    public static func == (lhs: AppGroups, rhs: AppGroups) -> Bool { lhs.groups == rhs.groups }
}
