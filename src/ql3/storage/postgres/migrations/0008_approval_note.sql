-- An optional free-text note stored with an approval decision (docs/console.md): at most 500
-- characters, no control characters (checked by the application), and only on a decided request.
ALTER TABLE approval_requests ADD COLUMN decision_note TEXT;
ALTER TABLE approval_requests ADD CONSTRAINT approval_requests_decision_note
  CHECK (decision_note IS NULL OR (char_length(decision_note) BETWEEN 1 AND 500 AND decision IS NOT NULL));
