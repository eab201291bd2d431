DROP TRIGGER approval_notify_update ON {s}.approvals;
DROP TRIGGER approval_notify_insert ON {s}.approvals;
DROP FUNCTION {s}.approval_notify();
DROP FUNCTION {s}.console_signed_out_v1(text);
DROP FUNCTION {s}.console_session_v1(text);
DROP FUNCTION {s}.console_signed_in_v1(text, text, text, interval, integer, interval);
DROP FUNCTION {s}.console_account_v1(text);
DROP TABLE {s}.console_sessions;
DROP TABLE {s}.console_users;
