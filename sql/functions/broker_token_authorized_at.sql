-- When Apple vouched for the authorization a stored refresh token came from (issue 35): the
-- later of authorized_at (Apple's time of the code exchange, written by broker_login_v2) and
-- obtained_at (the broker's time of storing it). obtained_at stands in where authorized_at is
-- NULL (tokens v0.24.0 stored) or older (v0.24.0's broker_login replaced the token and left
-- authorized_at as it was; docs/database.md, "Rolling upgrade").
CREATE OR REPLACE FUNCTION broker_token_authorized_at(t apple_tokens) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT GREATEST(t.authorized_at, t.obtained_at)
$$;
