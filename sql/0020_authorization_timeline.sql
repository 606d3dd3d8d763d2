-- 0020: the authorization timeline (issue 35; protocol reference §12): Apple's verdicts are
-- ordered by Apple's clock, never by when they reach the broker. Schema only; expand only:
-- both columns are nullable and the previous release neither reads nor writes them (its
-- functions keep working on the columns they know, see docs/database.md "Rolling upgrade").

-- When Apple last vouched for the user's authorization of this app group, in Apple's time:
-- the `iat` of the newest identity token a login verified, or the time of a code Apple just
-- exchanged (the `iat` of the id_token it returned). A `consent-revoked` whose event_time is
-- before this is stale: it is recorded and changes nothing. NULL: no sign-in of
-- this release yet (the grant row then decides by consent_at alone, as before).
ALTER TABLE apple_grants ADD COLUMN signed_in_at timestamptz;

-- The Apple time of the sign-in this refresh token came from (the code exchange that
-- yielded it). A sweep verdict on the token is about that authorization: when the group has a
-- later verified sign-in, the verdict ends this token only. NULL on tokens the previous
-- release stored; obtained_at (the broker's time of the exchange) stands in for it.
ALTER TABLE apple_tokens ADD COLUMN authorized_at timestamptz;
