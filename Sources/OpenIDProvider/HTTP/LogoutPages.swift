import HTTPServer

/// What the end-session endpoints answer a browser: a redirect to the relying party, a page
/// saying the person is signed out, the confirmation form, or why nothing was done. The
/// session cookie goes when the browser's session ended. Pages run no script and may not
/// be framed; the confirmation form may post only to this origin.
enum LogoutPages {
    static func response(_ outcome: EndSessionService.Outcome, clearCookie: Bool, confirmAction: String) -> HTTPResponse {
        var response: HTTPResponse
        switch outcome {
        case .redirect(let location):
            response = OpenIDRoutes.redirect(location)
        case .signedOut:
            response = HTMLPage.response(
                status: 200, title: "You are signed out",
                message: "You are signed out of Sign in with Apple here. You can close this page.", link: nil)
        case .refused(let message):
            response = HTMLPage.response(status: 400, title: "Sign-out did not happen", message: message, link: nil)
        case .confirm(let token):
            let html = """
                <!DOCTYPE html>
                <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
                <title>Sign out?</title></head>
                <body style="font-family: system-ui, sans-serif; max-width: 32em; margin: 4em auto; padding: 0 1em">
                <h1>Sign out?</h1><p>An application asks to sign you out of Sign in with Apple here. Applications you \
                signed in to through it are signed out too.</p>
                <form method="post" action="\(HTMLPage.escape(confirmAction))"><input type="hidden" name="token" \
                value="\(HTMLPage.escape(token))"><button type="submit">Sign out</button></form></body></html>
                """
            response = OpenIDRoutes.page(
                html,
                headers: [
                    "Content-Security-Policy":
                        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                    "Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
                ])
        }
        if clearCookie { response.headers.add("Set-Cookie", SessionCookie.clear) }
        return response
    }
}
