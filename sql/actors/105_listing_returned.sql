-- When a listing last came back after a poll of its watch that did not find it (set by
-- the scrape's upsert). With re-alerts off, a notified listing alerts again only when
-- it came back after its last notification, or its price fell under the one notified:
-- a price that merely moved (an auction's rising bid) is no news.
ALTER TABLE listings ADD COLUMN returned_at timestamptz;
