DROP TRIGGER journal_notify ON {s}.journal;
DROP FUNCTION {s}.journal_notify();
