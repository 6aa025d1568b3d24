-- Who issued a principal's current token: its creator, or whoever rotated it since (docs/security.md
-- "Separation of duty"). A decider whose token came, directly or through others, from the requester
-- is the requester's own hand. NULL: issued by the server itself (the owner) or before this column.
ALTER TABLE principals ADD COLUMN issued_by TEXT REFERENCES principals (id);
