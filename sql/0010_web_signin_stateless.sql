-- 0010: web sign-in's authorize writes nothing.
--
-- The state an authorization needs (client id, return_to, app_state, nonce, expiry) now
-- travels inside the OAuth `state`, sealed with a key derived from TOKEN_ENCRYPTION_KEY
-- (WebSignInState): an unauthenticated GET /v1/apple/web/authorize stored a row per call.
-- What remains is single use: a state is remembered, by its SHA-256, once Apple's id_token
-- for it verified, until the state expires. A row therefore costs a real sign-in at Apple.
DROP TABLE web_authorizations;

CREATE TABLE web_used_states (
    state_hash  text PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX web_used_states_expiry ON web_used_states (expires_at);

-- A result code holds a login answer (sub, e-mail, name): it goes with its user.
DELETE FROM web_results;
ALTER TABLE web_results ADD COLUMN user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE;
CREATE INDEX web_results_user ON web_results (user_id);
