-- 0022: what `outbox serve` needed to log in as less than the schema owner, and to modify
-- and delete assistants. Frozen: what revision 0022 applies, forever.

-- api_key_tenant_v1: "which tenant does this key act for?" A request's key is looked up
-- before any tenant is known. Until 0022 that took the schema owner's login; this
-- function lets a login that is only a member of outbox_api do it without reading
-- api_keys: given the SHA-256 of a key it answers that key's tenant, or NULL for an
-- unknown or revoked key. Nothing else about keys is visible to it.
CREATE FUNCTION {s}.api_key_tenant_v1(p_key_hash text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT tenant_id FROM {s}.api_keys WHERE key_hash = p_key_hash AND revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION {s}.api_key_tenant_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.api_key_tenant_v1(text) TO outbox_api;

-- An assistant can be deleted (DELETE /v1/assistants/{id}). The runs it started keep
-- their tools and history; their link to it is cleared (only assistant_id: the tenant
-- column of the link stays, which PostgreSQL 15's column list for SET NULL allows).
ALTER TABLE {s}.assistant_runs DROP CONSTRAINT assistant_runs_assistant_fk;
ALTER TABLE {s}.assistant_runs ADD CONSTRAINT assistant_runs_assistant_fk
    FOREIGN KEY (assistant_id, tenant_id) REFERENCES {s}.assistants (id, tenant_id)
    ON DELETE SET NULL (assistant_id);
GRANT DELETE ON {s}.assistants TO outbox_api;
