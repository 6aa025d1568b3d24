-- The database clock (migration 0001) as PL/pgSQL, same value and same volatility (docs/dispatch.md,
-- "Dispatch on PostgreSQL: round trips"; bench/README.md, issue 11).
--
-- Every transaction unit reads ql3_now_ms() once, and ql3_claim, ql3_write_run and ql3_lease_result
-- read it again. As a SQL function with a sub-select it is never inlined, and PostgreSQL plans the body
-- of a SQL function again for every statement that calls it (about 60 microseconds of server time a
-- call here); PL/pgSQL keeps the plan of its query for the session (about 17).
CREATE OR REPLACE FUNCTION ql3_now_ms() RETURNS BIGINT LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (floor(extract(epoch FROM transaction_timestamp()) * 1000))::BIGINT
         + (SELECT offset_ms FROM ql3_clock WHERE singleton);
END
$$;
