/// The session cookie (`__Host-`: HTTPS only, this host alone, every path). `SameSite=None`:
/// a relying party renewing silently (`prompt=none`) in an iframe of its own site, and Apple's
/// cross-site form post that ends a sign-in, must both carry it; HttpOnly, so no script reads it.
enum SessionCookie {
    static let name = "__Host-abk_oidc"

    static func set(_ secret: String, maxAgeSeconds: Int) -> String {
        "\(name)=\(secret); Path=/; Max-Age=\(maxAgeSeconds); Secure; HttpOnly; SameSite=None"
    }

    static let clear = "\(name)=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=None"
}
