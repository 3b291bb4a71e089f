"""The fleet journal: the requests of every replica, shipped into one PostgreSQL database.

Each replica keeps its local SQLite journal (`journal.schema`) as its durable buffer and ships
the requests it completed to PostgreSQL (`journal.pg.ship`). This package owns the PostgreSQL
side's storage: the schema and its migrations (`journal.pg.schema`), the day partitions
(`journal.pg.partitions`) and the batch write (`journal.pg.ship`). It imports nothing of smg.

README: what each table holds
-----------------------------

Every table but the two small bookkeeping ones is partitioned by RANGE on `day` (a `date`: the
UTC day of the request's arrival, `requests.ts`; 1970-01-01 for the rare request whose arrival
was never journaled), one partition per day named `<table>_pYYYYMMDD`. A request, its events and
its text are always in the same day, so retention drops whole partitions of all three tables at
once (`partitions.drop_before`), never deleting row by row. Every unique key includes `day`
(PostgreSQL requires the partition key in it); since a request's day is fixed by its arrival,
that still makes each key unique per request.

* `requests`: one summary row per shipped request, the columns of the local `requests` table
  (`journal.schema.REQUEST_COLUMNS`, same names, same meaning, same 0/1 integer flags, `ts` the
  arrival in epoch seconds as a `double precision`, exactly as stored locally), plus:
  `replica` (text, the `--replica-name` of the replica that served it), `rk` (bigint, a key
  unique across the fleet from the sequence `requests_rk_seq`: what `events` and
  `request_text` point to; NOT the local file's key), `local_rk` (the request's key in its
  replica's local file), `day` and `shipped_at` (timestamptz, when it reached PostgreSQL).
  Identity: `UNIQUE (replica, id, day)`, which is what makes shipping idempotent (a request
  shipped twice is inserted once). Indexes: `(ts)`, `(replica, ts)`, `(column, ts)` for
  model, status, backend, worker, stop_reason, and, partial (`WHERE column IS NOT NULL`),
  error_code, tenant, user_id, key_fp, thread_key; partial `(column)` for trace_id, session_id,
  replay_of; `(id text_pattern_ops)` and partial `(client_id text_pattern_ops)` for exact and
  prefix (`LIKE 'x%'`) lookups; partial `(ts) WHERE flag = 1` for has_tool_use, has_thinking,
  hung_up and cut_mid_stream.
* `events`: the request's events exactly as the local file stores them, keyed
  `PRIMARY KEY (rk, seq, day)`: `seq`, `kind`, `t` (seconds since arrival) and `data` (bytea):
  for kind `run` the packed bytes (`journal.packed.unpack(seq, t, data)`), for every other
  kind the event's JSON payload without `t` as UTF-8 (`journal.events.event_from_dict(kind,
  orjson.loads(data), t)`). To read a request's events: `SELECT seq, kind, t, data FROM events
  WHERE rk = %s AND day = %s ORDER BY seq` (giving `day` prunes to one partition).
* `request_text` (v2): the full-text index, one row per shipped request that has text: `rk`,
  `day`, `body` (what the local `request_text` FTS5 row holds: `journal.search`) and `tsv`, a
  generated `tsvector` (`smg_text_vector(body)`) with a GIN index. Words are split as SQLite's
  unicode61 tokenizer splits them (runs of letters and digits), lower-cased and unaccented. A
  free-text term compiles to `tsv @@ smg_text_query(%s, prefix)`: the words of the text as a
  phrase (`a <-> b`), the last one a prefix (`:*`) when `prefix` is true, NULL (matches
  nothing) when the text has no word, the same semantics as `journal.search.match_expression`.
* `replicas`: one row per replica that ever shipped: `name`, `first_shipped_at`,
  `last_shipped_at`, `requests` (how many it shipped).
* `schema_migrations`: one row per applied version (`version`, `description`,
  `applied_at`); the schema's version is `max(version)` (`schema.version`).
"""
