import BrokerCore
import Deliveries
import Foundation

/// The overview charts' figures: notifications and the two delivery backlogs, per UTC day of
/// the last `days` (at most 92), in a handful of categories each, read through their owners'
/// stores (BrokerCore's inbox, each lane's queue).
extension ConsoleStore {
    /// Notifications received per day and client id (empty: rows that name none).
    func notificationsByClient(days: Int) throws -> [DailyCount] { try notifications.countsByClient(days: days) }

    /// What waits (`pending`) or failed for good (`failed`) in a delivery queue, by the day it
    /// was queued; empty for a lane this process was not given.
    func backlogByDay(_ queue: BacklogQueue, days: Int) throws -> [DailyCount] {
        let lane =
            switch queue {
            case .webhooks: webhookQueue
            case .logouts: logoutQueue
            }
        return try lane?.backlogByDay(days: days).map {
            DailyCount(day: $0.day, category: $0.state.rawValue, count: $0.count)
        } ?? []
    }

    /// The delivery queues the overview charts.
    enum BacklogQueue { case webhooks, logouts }
}
