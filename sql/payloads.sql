-- Large payloads by reference: bodies above a size stored once per tenant, how every
-- reader resolves a reference, and the sweep of bodies nothing references. `{s}` is the
-- schema.


-- An argument, a result or a tool message above payload_inline_max_v1() bytes is stored
-- once per tenant in payloads, keyed by its digest (the hex SHA-256 of its UTF-8 text: for
-- arguments the model's raw text, for a result its output's canonical JSON text, for a
-- tool message its text; a result's body and its tool message's are the same text, so
-- they are stored once), and referenced from its row by the triggers payload_by_reference
-- (triggers.sql). A reference column (tool_calls.arguments_ref, tool_results.output_ref,
-- orphaned_results.output_ref, messages.content_ref) is NULL for a body kept inline; when
-- it is set, the inline column is empty (NULL, or '' for arguments_raw). Every reader
-- resolves with resolved_text_v1 or resolved_json_v1. Nothing below is ever a body that
-- differs from what was written.

-- payload_inline_max_v1: the largest body kept inline, in bytes: the setting
-- outbox.payload_inline_max (ALTER DATABASE ... SET outbox.payload_inline_max = '16384'),
-- 8192 when unset. A change applies to rows written from then on; rows already written
-- keep their form (both are read alike).
CREATE OR REPLACE FUNCTION {s}.payload_inline_max_v1() RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('outbox.payload_inline_max', true), '')::integer,
                    8192)
$$;

-- resolved_text_v1: a text column as written: p_inline, or the body p_ref names. Plain SQL
-- and STABLE: inlined where it is called; runs with the caller's rights (row-level
-- security applies to payloads as to the row that references it).
CREATE OR REPLACE FUNCTION {s}.resolved_text_v1(p_inline text, p_tenant_id text, p_ref text)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_ref IS NULL THEN p_inline
                ELSE (SELECT p.body FROM {s}.payloads p
                      WHERE p.digest = p_ref AND p.tenant_id = p_tenant_id) END
$$;
REVOKE ALL ON FUNCTION {s}.resolved_text_v1(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.resolved_text_v1(text, text, text)
    TO outbox_writer, outbox_relay, outbox_api;

-- resolved_json_v1: a JSON column as written: p_inline, or the body p_ref names as JSON.
CREATE OR REPLACE FUNCTION {s}.resolved_json_v1(p_inline jsonb, p_tenant_id text, p_ref text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_ref IS NULL THEN p_inline
                ELSE (SELECT p.body::jsonb FROM {s}.payloads p
                      WHERE p.digest = p_ref AND p.tenant_id = p_tenant_id) END
$$;
REVOKE ALL ON FUNCTION {s}.resolved_json_v1(jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.resolved_json_v1(jsonb, text, text)
    TO outbox_writer, outbox_relay, outbox_api;

-- payload_digest_v1: the digest a body is stored under.
CREATE OR REPLACE FUNCTION {s}.payload_digest_v1(p_body text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(p_body, 'UTF8')), 'hex')
$$;

-- payload_ref_v1: what the journal says of a body: {"digest", "bytes"} when it is stored
-- by reference (over payload_inline_max_v1()), else NULL (a small body is not named in
-- the journal: it never was). The jsonb form is a result's output; the text form a
-- call's raw arguments.
CREATE OR REPLACE FUNCTION {s}.payload_ref_v1(p_output jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_output IS NOT NULL
                     AND pg_column_size(p_output) * 6 > {s}.payload_inline_max_v1()
                     AND octet_length(p_output::text) > {s}.payload_inline_max_v1()
                THEN jsonb_build_object('digest', {s}.payload_digest_v1(p_output::text),
                                        'bytes', octet_length(p_output::text)) END
$$;
CREATE OR REPLACE FUNCTION {s}.payload_ref_v1(p_text text) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(p_text) > {s}.payload_inline_max_v1()
                THEN jsonb_build_object('digest', {s}.payload_digest_v1(p_text),
                                        'bytes', octet_length(p_text)) END
$$;

-- payload_put_v1: store p_body for p_tenant_id once and return its digest, holding a KEY
-- SHARE lock on its row until the caller commits. A sweep deletes a body only under a FOR
-- UPDATE lock of its row (SKIP LOCKED: a body being referenced is passed over) and after
-- checking again, in a fresh snapshot, that nothing references it; so a body this
-- function found already stored is either locked here before the sweep looks (kept), or
-- deleted first, in which case the lock finds no row and the body is stored again. The
-- reference's foreign key is the last word: no statement can leave a reference to a body
-- that is gone. Only the trigger functions call it (as the schema owner).
CREATE OR REPLACE FUNCTION {s}.payload_put_v1(p_tenant_id text, p_body text)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_digest text := {s}.payload_digest_v1(p_body);
BEGIN
    LOOP
        INSERT INTO {s}.payloads (digest, tenant_id, bytes, body)
        VALUES (v_digest, p_tenant_id, octet_length(p_body), p_body)
        ON CONFLICT (digest, tenant_id) DO NOTHING;
        PERFORM 1 FROM {s}.payloads p
        WHERE p.digest = v_digest AND p.tenant_id = p_tenant_id FOR KEY SHARE;
        IF FOUND THEN
            RETURN v_digest;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION {s}.payload_put_v1(text, text) FROM PUBLIC;

-- payload_referenced_v1: whether any row references the body (p_digest, p_tenant_id), in
-- the caller's snapshot. Each lookup goes through a partial index of references.
CREATE OR REPLACE FUNCTION {s}.payload_referenced_v1(p_digest text, p_tenant_id text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {s}.tool_calls c
                   WHERE c.arguments_ref = p_digest AND c.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.tool_results r
                   WHERE r.output_ref = p_digest AND r.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.orphaned_results o
                   WHERE o.output_ref = p_digest AND o.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.messages m
                   WHERE m.content_ref = p_digest AND m.tenant_id = p_tenant_id)
$$;
REVOKE ALL ON FUNCTION {s}.payload_referenced_v1(text, text) FROM PUBLIC;

-- sweep_payloads_v1: delete bodies nothing references any more; returns how many.
--
--   SELECT outbox.sweep_payloads_v1();                 -- up to 1000 bodies, see below
--   SELECT outbox.sweep_payloads_v1(ARRAY['9f86…']);   -- these digests only
--
-- retain_v1 and erase_thread_v1 sweep the digests they dropped references to; the relay's
-- retention task (and `outbox retention run`) sweeps the rest: a body left by a row
-- refused after its trigger stored it, or passed over below. Without digests it looks at
-- up to p_limit bodies from a random digest on (wrapping around), so each call costs the
-- same however many bodies there are and every body is looked at over the calls. Each
-- candidate is locked FOR UPDATE SKIP LOCKED (a body being referenced right now is locked
-- KEY SHARE by payload_put_v1 and is passed over) and checked again under the lock, in a
-- fresh snapshot, before it goes. Runs as the schema owner (SECURITY DEFINER), every
-- tenant.
CREATE OR REPLACE FUNCTION {s}.sweep_payloads_v1(p_digests text[] DEFAULT NULL,
                                                 p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_row   record;
    v_gone  integer := 0;
    v_seen  integer := 0;
    v_start text;
BEGIN
    IF p_digests IS NOT NULL THEN
        FOR v_row IN
            SELECT p.digest, p.tenant_id FROM {s}.payloads p
            WHERE p.digest = ANY (p_digests)
            ORDER BY p.digest, p.tenant_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        LOOP
            IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
                DELETE FROM {s}.payloads p
                WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
                v_gone := v_gone + 1;
            END IF;
        END LOOP;
        RETURN v_gone;
    END IF;
    v_start := {s}.payload_digest_v1(random()::text);
    FOR v_row IN
        SELECT p.digest, p.tenant_id FROM {s}.payloads p
        WHERE p.digest >= v_start
        ORDER BY p.digest, p.tenant_id
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        v_seen := v_seen + 1;
        IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
            DELETE FROM {s}.payloads p
            WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
            v_gone := v_gone + 1;
        END IF;
    END LOOP;
    FOR v_row IN
        SELECT p.digest, p.tenant_id FROM {s}.payloads p
        WHERE p.digest < v_start
        ORDER BY p.digest, p.tenant_id
        LIMIT greatest(p_limit - v_seen, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
            DELETE FROM {s}.payloads p
            WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
            v_gone := v_gone + 1;
        END IF;
    END LOOP;
    RETURN v_gone;
END $$;
REVOKE ALL ON FUNCTION {s}.sweep_payloads_v1(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.sweep_payloads_v1(text[], integer) TO outbox_relay;
