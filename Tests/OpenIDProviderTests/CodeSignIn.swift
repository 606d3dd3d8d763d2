import Foundation
import PostgresClient
import StrictJSON
import Testing

/// What a relying party holds after an Apple user signed in to it with the code flow.
struct CodeSignIn {
    let access: String
    let refresh: String
    let sid: String
    /// The provider's `sub` for the user (the broker's user id).
    let userID: String
    /// The user's Apple `sub`.
    let sub: String
}

extension ProviderHarness {
    /// Signs the Apple user (a new one when `sub` is nil) in to `client` with the code flow:
    /// its tokens, sid, the user's id and the Apple sub.
    func signInWithCode(_ client: RegisteredClient, sub: String? = nil) throws -> CodeSignIn {
        let back = try signIn(
            [
                ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI),
                ("scope", "openid email offline_access"), ("nonce", "n-1"),
            ],
            sim: sub.map { [("sim_sub", $0)] } ?? [])
        let tokens = try token(
            [
                ("grant_type", "authorization_code"), ("code", try #require(back.query["code"], "\(back.query)")),
                ("redirect_uri", client.redirectURI),
            ], as: client
        ).json
        let claims = try verifiedClaims(try #require(tokens["id_token"] as? String))
        let userID = try #require(claims["sub"]?.stringValue)
        let appleSub = try pool.query("SELECT sub FROM apple_identities WHERE user_id = \(UUID(uuidString: userID)!)")
            .single().decode(String.self, "sub")
        return CodeSignIn(
            access: try #require(tokens["access_token"] as? String), refresh: try #require(tokens["refresh_token"] as? String),
            sid: try #require(claims["sid"]?.stringValue), userID: userID, sub: appleSub)
    }
}
