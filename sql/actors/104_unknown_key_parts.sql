-- A product key keeps what the listing did not say as "?" (actors/extract_rules.py UNKNOWN):
-- RAM with no speed (`ram:ddr4:16gb:?`), a drive whose interface is unknown (`ssd:?:1tb`),
-- memory of unknown type (`ram:ddr?:...`). Such a key is incomplete, as are the keys
-- written before: RAM keyed with no speed part, and `ssd:sata:` keys whose sata was the
-- default (the attributes name no interface). Those listings are priced against the
-- wrong peers; the scheduled re-extraction reads them again.
CREATE OR REPLACE FUNCTION listing_extraction_incomplete(product_key text, attributes jsonb, extracted_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT extracted_at IS NOT NULL
       AND (product_key IS NULL
            OR product_key ~ '(^|:)[^:]*\?'
            OR (product_key LIKE 'item:%' AND attributes ? 'component')
            OR product_key ~ '^ram:[^:]+:[^:]+(:(sodimm|rdimm))?$'
            OR (product_key LIKE 'ssd:sata:%' AND attributes->>'interface' IS DISTINCT FROM 'sata'))
$$;
