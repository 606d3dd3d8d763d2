import CLibpq
import Glibc

/// One libpq connection (`PGconn`), finished in `deinit` whatever state it is in.
///
/// Not safe for concurrent use. It is `@unchecked Sendable` only so the pool can hand it
/// from thread to thread; the pool gives each connection to one caller at a time.
///
/// Directly connected, it sets the session settings once and prepares each statement once
/// (`PQprepare` + `PQexecPrepared`). Through a pooler in transaction mode (PgBouncer) the
/// session is not ours from one transaction to the next, so statements are unnamed
/// (`PQexecParams`; PgBouncer 1.18 cannot route named prepared statements there, SQLSTATE
/// 42P05) and the settings go with every transaction. Which one: a pooler answers the
/// startup with a backend key of its own, so `PQbackendPID` differs from the server's
/// `pg_backend_pid()`; directly they are the same process.
public final class PostgresConnection: @unchecked Sendable {
    private let handle: OpaquePointer
    /// The settings for one transaction, when a pooler may switch sessions; nil when they
    /// were set once for the session.
    private var transactionSettingsSQL: String?
    /// A statement this session knows, by its SQL: one entry, so a query hashes its SQL once.
    private struct Statement {
        /// Its prepared name; nil when it is due to be prepared again (`replanIfDue`).
        var name: String?
        /// Runs since the last DEALLOCATE ALL, kept when it is planned again.
        var runs = 0

        /// Counts a run; after the 100th, 1,000th, 10,000th and 100,000th, then every
        /// millionth, the name goes, so the next run prepares it again (`replanIfDue`).
        mutating func countRun() {
            runs += 1
            switch runs {
            case 100, 1_000, 10_000, 100_000: name = nil
            default: if runs % 1_000_000 == 0 { name = nil }
            }
        }
    }
    /// At most `maximumPreparedStatements` entries: DEALLOCATE ALL empties it.
    private var statements: [String: Statement] = [:]
    /// Names given out since the last DEALLOCATE ALL (a statement prepared again gets a new one).
    private var statementNumber = 0
    private static let maximumPreparedStatements = 512
    /// Set while COMMIT is in flight, so a connection failure then is reported as ambiguous.
    private var committing = false
    /// When the pool last handed this connection back.
    var idleSince: UInt64 = 0
    /// Round trips since the pool last counted them (`takeStatementCount`).
    private var statementCount = 0

    /// Connects with `PQconnectdbParams`.
    /// - Throws: `PostgresError.connectionFailed` with libpq's reason.
    public init(configuration: PostgresConfiguration) throws {
        let parameters = configuration.connectParameters()
        let keywords = parameters.map { strdup($0.0) }
        let values = parameters.map { strdup($0.1) }
        defer {
            keywords.forEach { free($0) }
            values.forEach { free($0) }
        }
        let keywordPointers: [UnsafePointer<CChar>?] = keywords.map { UnsafePointer($0) } + [nil]
        let valuePointers: [UnsafePointer<CChar>?] = values.map { UnsafePointer($0) } + [nil]
        // PQconnectdbParams always returns an object that must be finished, even on failure.
        guard let handle = PQconnectdbParams(keywordPointers, valuePointers, 1) else {
            throw PostgresError(.connectionFailed, serverMessage: "out of memory")
        }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle))
            PQfinish(handle)
            throw PostgresError(.connectionFailed, serverMessage: message)
        }
        // libpq prints server notices (and FATAL messages on termination) to stderr by
        // default; they are not ours to print, and errors reach callers as PostgresError.
        PQsetNoticeProcessor(handle, ignoreNotice, nil)
        self.handle = handle
        // (A throw from here on still runs deinit, which finishes the handle.)
        if configuration.transactionPooling ?? isBehindPooler() {
            transactionSettingsSQL = configuration.sessionSettingsSQL(local: true)
        } else {
            try execute(configuration.sessionSettingsSQL(local: false))
        }
    }

    /// True unless the server's own pid is the one the startup reported (or cannot be read).
    private func isBehindPooler() -> Bool {
        guard let result = PQexec(handle, "SELECT pg_backend_pid()") else { return true }
        defer { PQclear(result) }
        guard PQresultStatus(result) == PGRES_TUPLES_OK, PQntuples(result) == 1, let value = PQgetvalue(result, 0, 0) else {
            return true
        }
        return Int32(String(cString: value)) != PQbackendPID(handle)
    }

    deinit { PQfinish(handle) }

    /// False once libpq has seen the connection break.
    public var isOpen: Bool { PQstatus(handle) == CONNECTION_OK }

    /// The server process id (for `pg_terminate_backend` in tests).
    public var backendPID: Int32 { PQbackendPID(handle) }

    /// Runs one parameterised statement and returns its rows. Through a pooler: inside a
    /// transaction one `PQexecParams`; outside one (autocommit) in a pipeline behind the
    /// settings, so both run in one implicit transaction on one server session, in one
    /// round trip.
    @discardableResult
    public func query(_ query: PostgresQuery) throws -> PostgresRows {
        statementCount += 1
        guard let settings = transactionSettingsSQL else {
            let name = try statementName(for: query)
            let rows = try withBindPointers(query.binds) { values, lengths, formats in
                try consume(PQexecPrepared(handle, name, Int32(query.binds.count), values, lengths, formats, 0))
            }
            replanIfDue(query.sql)
            return rows
        }
        return try withBindPointers(query.binds) { values, lengths, formats in
            let count = Int32(query.binds.count)
            guard PQtransactionStatus(handle) == PQTRANS_IDLE else {
                return try consume(PQexecParams(handle, query.sql, count, nil, values, lengths, formats, 0))
            }
            return try pipelined(settings) { handle in
                PQsendQueryParams(handle, query.sql, count, nil, values, lengths, formats, 0)
            }
        }
    }

    /// Whether statements are unnamed and settings sent per transaction (a pooler in between).
    public var isPooled: Bool { transactionSettingsSQL != nil }

    /// Runs SQL text with no parameters through the simple-query protocol. It may hold
    /// several statements (migrations); only the last result is returned.
    @discardableResult
    public func execute(_ sql: String) throws -> PostgresRows {
        statementCount += 1
        return try consume(PQexec(handle, sql))
    }

    /// The round trips (queries, BEGIN, COMMIT) since the last call, for the pool's statistics.
    func takeStatementCount() -> Int {
        defer { statementCount = 0 }
        return statementCount
    }

    /// Sends `NOTIFY channel, payload` (through `pg_notify`, so the payload is a bind).
    public func notify(channel: String, payload: String = "") throws {
        try query("SELECT pg_notify(\(channel), \(payload))")
    }

    // MARK: Transactions (used by PostgresPool.withTransaction)

    /// BEGIN, and through a pooler the settings, in one simple-query round trip.
    func begin(_ isolation: PostgresIsolationLevel) throws {
        try execute(isolation.beginStatement + (transactionSettingsSQL.map { "; " + $0 } ?? ""))
    }

    func commit() throws {
        committing = true
        defer { committing = false }
        try execute("COMMIT")
    }

    /// Rolls back if the connection is still usable; errors are swallowed because the
    /// caller is already handling the error that made it roll back.
    func rollbackQuietly() {
        guard isOpen else { return }
        if let result = PQexec(handle, "ROLLBACK") { PQclear(result) }
    }

    /// Checks the socket without blocking: a server restart closes idle connections,
    /// and this notices before a query is sent on one.
    func isAlive() -> Bool {
        guard isOpen else { return false }
        var descriptor = pollfd(fd: PQsocket(handle), events: Int16(POLLIN), revents: 0)
        if poll(&descriptor, 1, 0) > 0 {
            if PQconsumeInput(handle) == 0 { return false }
            var notified = false
            while let notification = PQnotifies(handle) {
                PQfreemem(notification)
                notified = true
            }
            // Readable while idle, and not a notification: a terminated backend's FATAL message
            // (pg_terminate_backend, a shutdown), after which it closes the socket, a moment
            // too late for libpq to have seen it; or a message no idle session expects. A
            // fresh connection is the safe answer either way.
            if !notified { return false }
        }
        return isOpen
    }

    // MARK: Pipelines (used by PostgresReadPipeline)

    /// Sends `queries` back to back, each a prepared statement (prepared in the same pipeline
    /// when new), then one Sync, and reads their results: one write to the server and one
    /// read for the whole batch, instead of a round trip each. Everything before the Sync is
    /// one implicit transaction, so this is for statements that only read; the pipeline's
    /// session makes every transaction read-only to hold it to that. A statement that fails
    /// aborts those after it: their outcome is nil, to be sent again.
    /// - Throws: when the connection broke; no outcome is known then.
    func runPipeline(_ queries: [PostgresQuery]) throws -> [Result<PostgresRows, any Error>?] {
        precondition(transactionSettingsSQL == nil, "named statements need a session of our own")
        if statementNumber + queries.count > Self.maximumPreparedStatements {
            try deallocateAll()
        }
        guard PQenterPipelineMode(handle) == 1 else { throw connectionError(nil) }
        defer { _ = PQexitPipelineMode(handle) }
        enum Step {
            case prepare(sql: String, name: String, query: Int)
            case execute(query: Int)
        }
        var steps: [Step] = []
        var preparing: [String: String] = [:]
        var outcomes = [Result<PostgresRows, any Error>?](repeating: nil, count: queries.count)
        for (index, query) in queries.enumerated() {
            // A bind that cannot be sent fails its statement alone, before anything is sent.
            if query.binds.contains(where: {
                guard case .text(let text) = $0 else { return false }
                return text.utf8.withContiguousStorageIfAvailable { $0.contains(0) } ?? text.utf8.contains(0)
            }) {
                outcomes[index] = .failure(PostgresError(.invalidBind, serverMessage: "text parameter contains a NUL byte"))
                continue
            }
            var name = statements[query.sql]?.name ?? preparing[query.sql]
            if name == nil {
                statementNumber += 1
                let fresh = "s\(statementNumber)"
                guard PQsendPrepare(handle, fresh, query.sql, Int32(query.binds.count), nil) == 1 else {
                    throw connectionError(nil)
                }
                preparing[query.sql] = fresh
                steps.append(.prepare(sql: query.sql, name: fresh, query: index))
                name = fresh
            }
            let sent = try withBindPointers(query.binds) { values, lengths, formats in
                PQsendQueryPrepared(handle, name, Int32(query.binds.count), values, lengths, formats, 0)
            }
            guard sent == 1 else { throw connectionError(nil) }
            statementCount += 1
            steps.append(.execute(query: index))
        }
        guard PQpipelineSync(handle) == 1 else { throw connectionError(nil) }
        // Each step answers with one result and a NULL; an aborted one with PGRES_PIPELINE_ABORTED.
        for step in steps {
            guard let result = PQgetResult(handle) else { throw connectionError(nil) }
            let status = PQresultStatus(result)
            switch step {
            case .prepare(let sql, let name, let index):
                if status == PGRES_COMMAND_OK {
                    statements[sql, default: Statement()].name = name
                    PQclear(result)
                } else if status == PGRES_PIPELINE_ABORTED {
                    PQclear(result)
                } else {
                    // The statement itself is bad: its execution is aborted, the error is its outcome.
                    outcomes[index] = Result { try consume(result) }
                }
            case .execute(let index):
                if status == PGRES_PIPELINE_ABORTED {
                    PQclear(result)
                } else if outcomes[index] == nil {
                    outcomes[index] = Result { try consume(result) }
                    replanIfDue(queries[index].sql)
                } else {
                    PQclear(result)
                }
            }
            if let extra = PQgetResult(handle) {
                PQclear(extra)
                throw connectionError(nil)
            }
        }
        guard let sync = PQgetResult(handle) else { throw connectionError(nil) }
        defer { PQclear(sync) }
        guard PQresultStatus(sync) == PGRES_PIPELINE_SYNC else { throw connectionError(nil) }
        return outcomes
    }

    // MARK: Listening (used by PostgresListener)

    var socket: Int32 { PQsocket(handle) }

    /// Reads what has arrived and returns pending notifications; false when the connection broke.
    func drainNotifications(_ deliver: (String, String) -> Void) -> Bool {
        guard PQconsumeInput(handle) == 1 else { return false }
        while let notification = PQnotifies(handle) {
            let channel = String(cString: notification.pointee.relname)
            let payload = String(cString: notification.pointee.extra)
            PQfreemem(notification)
            deliver(channel, payload)
        }
        return isOpen
    }

    // MARK: Internals

    /// Sends the settings, then `send`'s statement, then a Sync, and returns the statement's
    /// rows. The extended protocol runs everything before a Sync in one implicit transaction,
    /// so the `SET LOCAL`s apply to the statement and PgBouncer keeps one server for both.
    private func pipelined(_ settings: String, _ send: (OpaquePointer) -> Int32) throws -> PostgresRows {
        guard PQenterPipelineMode(handle) == 1 else { throw connectionError(nil) }
        defer { _ = PQexitPipelineMode(handle) }
        guard PQsendQueryParams(handle, settings, 0, nil, nil, nil, nil, 0) == 1, send(handle) == 1,
            PQpipelineSync(handle) == 1
        else { throw connectionError(nil) }
        // Results: settings, NULL, statement (or PGRES_PIPELINE_ABORTED), NULL, PGRES_PIPELINE_SYNC.
        var outcomes: [Result<PostgresRows, any Error>] = []
        var ends = 0
        while true {
            guard let result = PQgetResult(handle) else {
                ends += 1
                if !isOpen || ends > 2 { throw connectionError(nil) }
                continue
            }
            if PQresultStatus(result) == PGRES_PIPELINE_SYNC {
                PQclear(result)
                break
            }
            outcomes.append(Result { try consume(result) })
        }
        // The first failure is the cause (a failed setting aborts the statement behind it).
        if let failure = outcomes.first(where: { if case .failure = $0 { true } else { false } }) {
            _ = try failure.get()
        }
        guard outcomes.count == 2 else { throw connectionError(nil) }
        return try outcomes[1].get()
    }

    /// Named statements are planned again after 100, 1,000, 10,000 and 100,000 runs on this
    /// connection, then every million: a statement gets its generic plan at its sixth run, on a
    /// fresh database perhaps while the tables are empty, and that plan can be a scan of every
    /// grant of the app (the login benchmark, through the read pipeline's one connection: 3-5 ms
    /// of PostgreSQL per login). The pool's connections run the same risk, later. The next run
    /// prepares it anew under a new name; the old one goes at the next DEALLOCATE ALL.
    private func replanIfDue(_ sql: String) {
        statements[sql, default: Statement()].countRun()
    }

    private func statementName(for query: PostgresQuery) throws -> String {
        if let name = statements[query.sql]?.name { return name }
        if statementNumber >= Self.maximumPreparedStatements {
            try deallocateAll()
        }
        statementNumber += 1
        let name = "s\(statementNumber)"
        try consume(PQprepare(handle, name, query.sql, Int32(query.binds.count), nil))
        statements[query.sql, default: Statement()].name = name
        return name
    }

    private func deallocateAll() throws {
        try execute("DEALLOCATE ALL")
        statements.removeAll()
        statementNumber = 0
    }

    /// Copies binds into C memory for the duration of one call.
    private func withBindPointers<R>(
        _ binds: [PostgresBind],
        _ body: ([UnsafePointer<CChar>?], [Int32], [Int32]) throws -> R
    ) throws -> R {
        var buffers: [UnsafeMutablePointer<CChar>?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        buffers.reserveCapacity(binds.count)
        defer { buffers.forEach { $0?.deallocate() } }
        for bind in binds {
            switch bind {
            case .null:
                buffers.append(nil)
                lengths.append(0)
                formats.append(0)
            case .text(let text):
                var utf8 = Array(text.utf8)
                guard !utf8.contains(0) else {
                    throw PostgresError(.invalidBind, serverMessage: "text parameter contains a NUL byte")
                }
                utf8.append(0)
                let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: utf8.count)
                utf8.withUnsafeBytes { buffer.initialize(from: $0.bindMemory(to: CChar.self).baseAddress!, count: utf8.count) }
                buffers.append(buffer)
                lengths.append(Int32(utf8.count - 1))
                formats.append(0)
            case .bytes(let bytes):
                let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, bytes.count))
                bytes.withUnsafeBytes { raw in
                    if raw.count > 0 {
                        buffer.initialize(from: raw.bindMemory(to: CChar.self).baseAddress!, count: raw.count)
                    }
                }
                buffers.append(buffer)
                lengths.append(Int32(bytes.count))
                formats.append(1)
            }
        }
        return try body(buffers.map { UnsafePointer($0) }, lengths, formats)
    }

    /// Turns a `PGresult` into rows or an error, and clears it.
    @discardableResult
    private func consume(_ result: OpaquePointer?) throws -> PostgresRows {
        guard let result else { throw connectionError(nil) }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
            return copyRows(result)
        default:
            if !isOpen { throw connectionError(result) }
            let sqlState = field(result, "C")
            throw PostgresError(
                .queryFailed, sqlState: sqlState, constraint: field(result, "n"),
                serverMessage: field(result, "M"))
        }
    }

    private func connectionError(_ result: OpaquePointer?) -> PostgresError {
        let message = result.flatMap { field($0, "M") } ?? String(cString: PQerrorMessage(handle))
        // The failure may have been the server ending our backend (57P01 on shutdown).
        let sqlState = result.flatMap { field($0, "C") }
        return PostgresError(committing ? .commitOutcomeUnknown : .connectionLost, sqlState: sqlState, serverMessage: message)
    }

    private func field(_ result: OpaquePointer, _ code: Character) -> String? {
        guard let value = PQresultErrorField(result, Int32(code.asciiValue!)) else { return nil }
        return String(cString: value)
    }

    private func copyRows(_ result: OpaquePointer) -> PostgresRows {
        let rowCount = Int(PQntuples(result))
        let columnCount = Int(PQnfields(result))
        var columns: [String] = []
        columns.reserveCapacity(columnCount)
        for column in 0..<columnCount {
            columns.append(String(cString: PQfname(result, Int32(column))))
        }
        var cells: [PostgresCell] = []
        cells.reserveCapacity(rowCount * columnCount)
        for row in 0..<Int32(rowCount) {
            for column in 0..<Int32(columnCount) {
                if PQgetisnull(result, row, column) == 1 {
                    cells.append(.null)
                } else {
                    let length = Int(PQgetlength(result, row, column))
                    let value = PQgetvalue(result, row, column)!
                    cells.append(
                        .text(
                            value.withMemoryRebound(to: UInt8.self, capacity: length) {
                                String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
                            }))
                }
            }
        }
        let affected = Int(String(cString: PQcmdTuples(result))) ?? 0
        return PostgresRows(columns: columns, cells: cells, affectedRows: affected)
    }
}

/// Transaction isolation levels.
public enum PostgresIsolationLevel: Sendable {
    case readCommitted, repeatableRead, serializable

    var beginStatement: String {
        switch self {
        case .readCommitted: "BEGIN"
        case .repeatableRead: "BEGIN ISOLATION LEVEL REPEATABLE READ"
        case .serializable: "BEGIN ISOLATION LEVEL SERIALIZABLE"
        }
    }
}

/// A libpq notice processor that drops notices (a plain function: libpq calls it from C).
private func ignoreNotice(_ context: UnsafeMutableRawPointer?, _ message: UnsafePointer<CChar>?) {}
