-- 0013: revocation you can trust in both directions (issue 28; protocol reference §11).
-- Schema only (docs/database.md): expand only; the previous release reads apple_tokens as
-- before (a token with revoked_at set is no live token to it either). The function that
-- writes these columns is sql/functions/broker_invalidate_token.sql.

-- Why a token stopped being live: 'token_invalid' when Apple answered invalid_grant to its
-- refresh (a password change does that while the user's authorization stays, forum thread
-- 651237): the consent is kept and the user needs a fresh sign-in to store a new token.
-- NULL for the older causes (a transfer retired it). A new login's upsert clears revoked_at,
-- so "revoked_at IS NOT NULL AND revoked_reason = 'token_invalid'" is the state.
-- last_validation_error: the `kind` of the token's last failed validation, so that an
-- unworded invalid_request is counted as a revocation only when it repeats for this token
-- while others refresh (TN3107 lists request defects under the same code).
ALTER TABLE apple_tokens
    ADD COLUMN revoked_reason text,
    ADD COLUMN last_validation_error text;
