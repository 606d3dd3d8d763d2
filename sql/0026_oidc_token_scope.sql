-- 0026: an access token's own scope (RFC 6749 §6): a refresh may ask for less than the grant
-- holds, and the access token it gets then carries only that; NULL is the grant's scope (every
-- token before this release, and every token of the previous release). Expand only: a nullable
-- column the previous release neither reads nor writes, so its introspection and userinfo still
-- see the grant's scope, as before.
ALTER TABLE oidc_tokens ADD COLUMN scope text;
