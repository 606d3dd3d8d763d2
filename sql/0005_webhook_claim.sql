-- 0005: the webhook dispatcher's claim (a function: sql/functions/broker_claim_webhook_delivery.sql).

-- A queue table: analyse and vacuum it after a few percent of change, not the default 10-20%.
ALTER TABLE webhook_deliveries SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
