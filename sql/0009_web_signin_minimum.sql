-- 0009: web sign-in keeps nothing personal beside the state.
--
-- The first-authorization name was written into web_authorizations when the state was
-- consumed, and the verified sub afterwards; nothing ever read either back. A name that
-- came with a token that failed verification belongs to nobody the broker can name, and
-- these rows were not purged with the user. The name Apple sends once is kept where it can
-- be: on the identity, whenever the token verified (even when the code exchange failed).
ALTER TABLE web_authorizations DROP COLUMN given_name, DROP COLUMN family_name, DROP COLUMN apple_sub;
