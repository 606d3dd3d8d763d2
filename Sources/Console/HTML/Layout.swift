import HTTPServer

/// The frame every console page shares, the one stylesheet, and the headers of every
/// console response (set by the console's server, so its own 404s carry them too).
enum Layout {
    /// No script anywhere; styles only from our stylesheet; forms only to ourselves; never framed.
    static let contentSecurityPolicy =
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    static let headers: HTTPHeaders = [
        "Content-Security-Policy": contentSecurityPolicy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin",
        "Cache-Control": "no-store",
    ]

    /// A whole page. `session` nil: the signed-out frame (no navigation).
    static func page(_ title: String, session: ConsoleSession?, status: Int = 200, head: HTML = .empty, _ body: HTML)
        -> HTTPResponse
    {
        let navigation: HTML
        if let session {
            var links: [HTML] = [link("/", "Overview"), link("/deletions", "Deletions")]
            if session.allows(.compliance) {
                links += [link("/deletions/new", "New deletion"), link("/follow-ups", "Follow-ups"), link("/lookup", "Lookup")]
            }
            links += [link("/webhooks", "Webhooks"), link("/notifications", "Apple notifications")]
            if session.allows(.keyViewers) { links.append(link("/api-keys", "API keys")) }
            if session.allows(.auditors) { links.append(link("/audit", "Audit log")) }
            navigation = """
                <header><nav aria-label="Console"><ul>\(links)</ul></nav>
                <form method="post" action="/logout" class="signout">\(csrfField(session))
                <span>\(session.operatorName) (\(session.roles.sorted().map(\.rawValue).joined(separator: ", ")))</span>
                <button type="submit">Sign out</button></form></header>
                """
        } else {
            navigation = .empty
        }
        let html: HTML = """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(title) · appleid-broker console</title><link rel="stylesheet" href="/console.css">\(head)</head>
            <body>\(navigation)<main id="main"><h1>\(title)</h1>
            \(body)</main></body></html>
            """
        return HTTPResponse(
            status: status, headers: ["Content-Type": "text/html; charset=utf-8"], body: Array(html.markup.utf8))
    }

    static func link(_ href: String, _ label: String) -> HTML { "<li><a href=\"\(href)\">\(label)</a></li>" }

    /// The hidden form field every POST form carries (`csrf_token`).
    static func csrfField(_ session: ConsoleSession) -> HTML {
        "<input type=\"hidden\" name=\"csrf_token\" value=\"\(session.csrfToken)\">"
    }

    /// A page saying why a request was refused (403, 404, 400, …), with a way on.
    static func refusal(_ status: Int, _ title: String, _ message: String, session: ConsoleSession?) -> HTTPResponse {
        page(
            title, session: session, status: status,
            "<p class=\"refusal\">\(message)</p><p><a href=\"/\">Back to the overview</a></p>")
    }

    /// 429 with `Retry-After` when the client address has used up `limiter`'s budget; nil
    /// (and one token taken) otherwise. For the pages anyone may use that cost a database write.
    static func overBudget(_ limiter: RateLimiter, _ request: ConsoleRequest) -> HTTPResponse? {
        guard let wait = limiter.acquire(RateLimiter.addressKey(request.http.remoteAddress)) else { return nil }
        var response = refusal(
            429, "Too many attempts", "Too many sign-in attempts from your address. Wait \(wait) seconds.", session: nil)
        response.headers.set("Retry-After", String(wait))
        return response
    }

    /// A 200 page that moves on to `location` by itself (a meta refresh, which CSP does not
    /// govern) and offers a link: for where a 303 would break `form-action` or a Strict cookie.
    static func moveOn(to location: String, session: ConsoleSession?, title: String = "Sign in again to continue")
        -> HTTPResponse
    {
        page(
            title, session: session,
            head: "<meta http-equiv=\"refresh\" content=\"0;url=\(location)\">",
            "<p>This action needs a recent sign-in. <a href=\"\(location)\">Continue</a></p>")
    }

    static func redirect(_ location: String, cookie: String? = nil) -> HTTPResponse {
        var response = HTTPResponse(status: 303, headers: ["Location": location])
        if let cookie { response.headers.add("Set-Cookie", cookie) }
        return response
    }

    static let stylesheet = """
        :root { color-scheme: light; --ink: #1d1d1f; --muted: #4a4a4f; --line: #c9c9cf; --accent: #0a4fa3; --bad: #a1111b; --good: #1d6b2f; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 16px/1.5 system-ui, "DejaVu Sans", sans-serif; color: var(--ink); background: #fff; }
        header { display: flex; justify-content: space-between; align-items: center; flex-wrap: wrap; gap: 1em; padding: .5em 1.5em; border-bottom: 1px solid var(--line); background: #f5f5f7; }
        header ul { list-style: none; display: flex; gap: 1.2em; margin: 0; padding: 0; }
        main { max-width: 72em; margin: 0 auto; padding: 1em 1.5em 3em; }
        a { color: var(--accent); }
        a:focus, button:focus, input:focus, select:focus, textarea:focus { outline: 3px solid #f0b400; outline-offset: 2px; }
        table { border-collapse: collapse; width: 100%; margin: 1em 0; }
        caption { text-align: left; font-weight: 600; padding: .3em 0; }
        th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid var(--line); vertical-align: top; }
        td a { display: inline-block; min-height: 24px; min-width: 24px; padding: .15em 0; } /* WCAG 2.5.8 target size */
        dl { display: grid; grid-template-columns: max-content 1fr; gap: .3em 1.2em; }
        dt { font-weight: 600; }
        dd { margin: 0; }
        form.signout { display: flex; gap: .8em; align-items: center; }
        label { display: block; font-weight: 600; margin-top: .8em; }
        input, select, textarea, button { font: inherit; }
        input, select, textarea { padding: .3em .4em; border: 1px solid var(--muted); border-radius: 3px; min-width: 18em; }
        button { margin-top: 1em; padding: .4em 1em; border: 1px solid var(--accent); background: var(--accent); color: #fff; border-radius: 3px; cursor: pointer; }
        button.danger { background: var(--bad); border-color: var(--bad); }
        .state-failed, .refusal { color: var(--bad); font-weight: 600; }
        .state-done { color: var(--good); font-weight: 600; }
        .hint { color: var(--muted); }
        .code { font-family: "DejaVu Sans Mono", monospace; font-size: 1.2em; letter-spacing: .1em; }
        figure.chart { margin: 1.5em 0 2em; }
        figure.chart figcaption { font-weight: 600; }
        svg.chart { display: block; width: 100%; max-width: 40em; height: auto; }
        svg.chart text { fill: var(--muted); font-size: 11px; }
        svg.chart .axis { stroke: var(--muted); stroke-width: 1; }
        svg.chart .grid { stroke: var(--line); stroke-width: 1; stroke-dasharray: 3 3; }
        ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: .3em 1.2em; margin: .3em 0; padding: 0; font-size: .9em; }
        .swatch { display: inline-block; width: .9em; height: .9em; margin-right: .35em; vertical-align: -.1em; border-radius: 2px; }
        .c-good { fill: #1d6b2f; background: #1d6b2f; } .c-bad { fill: #a1111b; background: #a1111b; }
        .c-wait { fill: #0a4fa3; background: #0a4fa3; } .c-warn { fill: #9a6700; background: #9a6700; }
        .c-info { fill: #0e7490; background: #0e7490; } .c-violet { fill: #6d28d9; background: #6d28d9; }
        .c-teal { fill: #047857; background: #047857; } .c-rose { fill: #be185d; background: #be185d; }
        .c-grey { fill: #6b6b72; background: #6b6b72; }
        details summary { cursor: pointer; color: var(--accent); }
        @media print { header, form, nav { display: none; } }
        """
}
