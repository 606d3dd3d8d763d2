-- 20,000 users with one identity each, subs as the simulator's batch endpoints draw them.
INSERT INTO users (id) SELECT gen_random_uuid() FROM generate_series(0, 19999);
INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, email, email_verified, is_private_email, last_login_at)
SELECT gen_random_uuid(), u.id, 'BENCHTEAM1', '001234.' || lpad((row_number() OVER () - 1)::text, 32, '0') || '.0042',
       'com.example.app', 'u' || (row_number() OVER () - 1) || '@privaterelay.appleid.com', true, true, now()
FROM users u;
