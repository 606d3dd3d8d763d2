-- What a database's schema and functions are, one line each, sorted: columns (with position,
-- type, nullability, default), relations (kind, storage options), constraints, indexes,
-- triggers, and functions (signature, result, language, volatility, settings, md5 of the
-- body). Tests and scripts/rolling-upgrade.py compare databases with it; the
-- expected output is kept beside it (expected.txt). Defaults print as the server's own style
-- prints them, whatever style the session asked for.
SET IntervalStyle = postgres;
SELECT line FROM (
    SELECT format('column %s.%s #%s %s%s%s', c.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod),
                  CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                  coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')) AS line
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0
      AND NOT a.attisdropped
    UNION ALL
    SELECT format('relation %s %s %s', c.relname, c.relkind, coalesce(array_to_string(c.reloptions, ','), ''))
    FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
    UNION ALL
    SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT format('function %s returns %s %s %s %s md5:%s', p.oid::regprocedure, pg_get_function_result(p.oid),
                  l.lanname, p.provolatile, coalesce(array_to_string(p.proconfig, ','), ''), md5(p.prosrc))
    FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'public'::regnamespace
) AS catalog ORDER BY line COLLATE "C"
