import BrokerCrypto

/// Binds an authorization's trip to Apple to the browser that started it, as the web sign-in
/// binds its own: the sealed state carries the SHA-256 of a secret only that browser's
/// `__Host-` cookie holds, and Apple's form post is refused without it. Otherwise a person's
/// own answer from Apple, posted from another browser (login CSRF), would sign that browser in
/// at the provider as them and leave them a session there.
///
/// One secret per browser, reused by every authorization it starts while the cookie lives, so
/// two under way at once (two tabs, two relying parties) both finish. `SameSite=None`: Apple's
/// form post is cross-site.
enum BrowserBinding {
    static let name = "__Host-abk_oidc_binding"

    /// The browser's secret: the one its cookie holds when it is one of ours in form (43
    /// base64url characters), else a new one.
    static func secret(reusing presented: String?) -> String {
        if let presented, presented.utf8.count == 43, Base64URL.decode(presented)?.count == 32 { return presented }
        return Base64URL.encode(SecureRandom.bytes(32))
    }

    static func set(_ secret: String, maxAgeSeconds: Int) -> String {
        "\(name)=\(secret); Path=/; Max-Age=\(maxAgeSeconds); Secure; HttpOnly; SameSite=None"
    }

    /// What the state keeps: the secret's hex SHA-256.
    static func hash(_ secret: String) -> String { SHA256.hexHash(secret) }

    /// Whether the presented cookie is the one whose hash the state keeps.
    static func matches(_ presented: String?, hash: String) -> Bool {
        let computed = presented.map { Array(SHA256.hexHash($0).utf8) } ?? []
        return ConstantTime.equals(computed, Array(hash.utf8))
    }
}
