/// A state or outcome kept as text, bound by its raw value: conform an enum whose raw values
/// are the SQL values (its decoding side is in PostgresRows.swift), so a query says
/// `\(UserStatus.active)` and never spells the state as a string.
extension PostgresEncodable where Self: RawRepresentable, RawValue == String {
    public var postgresBind: PostgresBind { .text(rawValue) }
}
