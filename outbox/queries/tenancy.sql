-- name: scope
-- Bind this transaction to one tenant: row-level security shows and accepts only its rows.
SELECT set_config('outbox.tenant_id', %(tenant_id)s, true)

-- name: role_facts
-- What a role may see beyond row-level security, before it is bound to a tenant.
SELECT r.rolname, r.rolsuper OR r.rolbypassrls AS bypasses_rls,
       pg_has_role(r.oid, 'outbox_relay', 'MEMBER') AS is_relay,
       r.oid = (SELECT c.relowner FROM pg_class c WHERE c.oid = '{s}.runs'::regclass)
           OR pg_has_role(r.oid, (SELECT c.relowner FROM pg_class c
                                  WHERE c.oid = '{s}.runs'::regclass), 'MEMBER') AS is_owner,
       (SELECT m.tenant_id FROM {s}.tenant_roles m WHERE m.role_name = r.rolname) AS bound_to
FROM pg_roles r WHERE r.rolname = %(role)s

-- name: bind_role
INSERT INTO {s}.tenant_roles (role_name, tenant_id, granted_by)
VALUES (%(role)s, %(tenant_id)s, %(actor)s)
ON CONFLICT (role_name) DO NOTHING
RETURNING role_name, tenant_id, granted_by, granted_at

-- name: unbind_role
DELETE FROM {s}.tenant_roles WHERE role_name = %(role)s RETURNING role_name, tenant_id

-- name: roles
SELECT role_name, tenant_id, granted_by, granted_at FROM {s}.tenant_roles
ORDER BY tenant_id, role_name
