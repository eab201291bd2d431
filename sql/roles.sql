-- The roles the grants of the function files and policies.sql name, as the newest migration
-- leaves them. Applied first: every other file
-- grants to them. tests/migration/test_history.py checks that re-applying changes nothing.
--
-- Each is NOLOGIN: give it to your own login roles (GRANT outbox_writer TO app_backend),
-- and bind a backend's login to one tenant with `outbox tenants grant`.
--
--   outbox_writer   backends (the Python writer API, the SQL API): write
--                   intents and read their own tenant's rows; never claim, lease or finish
--                   outbox rows, never read the journal.
--   outbox_relay    relay workers: claim, lease and complete outbox rows of every tenant.
--   outbox_auditor  DBAs and auditors: the journal, the views of views.sql and the
--                   configuration and decisions (budgets, rules, approvals, ...), every
--                   tenant, never a write.
--   outbox_api      what `outbox serve` acts as inside a request, scoped to the API key's
--                   tenant: outbox_writer's rights, plus its tenant's journal (the event
--                   stream), its own client tools and the Assistants and Responses objects.
--
-- Roles belong to the cluster while the schema belongs to one database, and several
-- databases may share a server (staging beside production, every test database): a role is
-- created only when missing, a concurrent creator is tolerated, and nothing here alters or
-- drops one that exists. A schema owner that may not create roles gets an error naming the
-- statement a superuser runs once.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['outbox_writer', 'outbox_relay', 'outbox_auditor', 'outbox_api']
    LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS',
                           v_role);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;  -- created concurrently
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role % does not exist and % may not create it', v_role, current_user
                    USING HINT = format('create it once as a superuser: CREATE ROLE %I NOLOGIN',
                                        v_role);
        END;
    END LOOP;
END $$;
