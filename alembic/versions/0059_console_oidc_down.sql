DROP FUNCTION {s}.console_oidc_signed_in_v1(text, text, text, interval);
REVOKE SELECT (oidc_subject) ON {s}.console_users FROM outbox_auditor;
DROP INDEX {s}.console_users_oidc_subject;
ALTER TABLE {s}.console_users DROP CONSTRAINT console_users_signs_in;
ALTER TABLE {s}.console_users ALTER COLUMN password_hash SET NOT NULL;
ALTER TABLE {s}.console_users DROP COLUMN oidc_subject;
