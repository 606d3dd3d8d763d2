-- 0008: deleting a user the broker holds no refresh token for (protocol reference §10.3).
--
-- Apple's answer (revoke-tokens documentation, TN3194): obtain tokens by validating a fresh
-- authorization code (the app's "delete my account" screen re-authenticates), and if there
-- is none, tell the user to stop using Sign in with Apple for the app by hand.

-- A code handed over with the request, sealed like refresh tokens (AES-256-GCM under
-- TOKEN_ENCRYPTION_KEY, bound to the user): a bearer secret for five minutes, cleared as
-- soon as the job has exchanged it, and at the purge. What the deletion came to at Apple is
-- kept (no personal data): revoked, already_invalid, skipped_apple_initiated, manual_required.
ALTER TABLE deletion_requests
    ADD COLUMN authorization_code bytea,
    ADD COLUMN code_key_id text,
    ADD COLUMN code_client_id text,
    ADD COLUMN code_redirect_uri text,
    ADD COLUMN apple_revocation text
        CHECK (apple_revocation IN ('revoked', 'already_invalid', 'skipped_apple_initiated', 'manual_required'));

-- The access token of a code exchange, sealed like the refresh token and kept until it
-- expires: Apple's revoke accepts both, and revoking ends the grant either way.
ALTER TABLE apple_tokens
    ADD COLUMN access_token bytea,
    ADD COLUMN access_key_id text,
    ADD COLUMN access_expires_at timestamptz;

-- The purge that clears the code: sql/functions/broker_purge_user.sql.
