-- 0041: the relay's role no longer starts, cancels or creates anything.
-- Frozen: what revision 0041 applies, forever.
--
-- outbox_relay was granted the writer's entry points (create_thread_v1, start_run_v1/v2,
-- same_run_request_v1, cancel_run_v1) beside outbox_writer since the
-- roles were made, though no relay statement calls them: the relay claims, executes and
-- records. It keeps enter_tenant_v1, which record_model_turns_v1 calls as
-- its invoker. A relay's credentials that leak could start runs in any tenant's name. Revoked;
-- a backend that starts runs uses outbox_writer (or outbox_api through outbox serve).

REVOKE EXECUTE ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb),
                           {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                            text, integer, bigint, integer, double precision,
                                            text, numeric),
                           {s}.start_run_v2(text, uuid, text, text, text[], text, text, text,
                                            text, integer, bigint, integer, double precision,
                                            text, numeric, text, text),
                           {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                           {s}.cancel_run_v1(text, uuid, text)
    FROM outbox_relay;
