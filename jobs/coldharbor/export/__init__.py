"""CDC export: the dirty set of a table read in one PostgreSQL snapshot (`hot_reader`; the SQL of
an image and of exact history's chained images, `image_sql`), the batch marked flushed by
compare-and-set on the change ids it read (`batches`, invariants 1 and 2), a table's export that
commits to Delta first and marks after (`table_export`, invariants 3, 4 and 9), the job's cycle
over the tables (`export_job`; several tables at once: `workers`), the batches a dead run left,
finished or abandoned before anything new is read (`recovery`), and the initial load and resync
base of a table registered with rows in it (`base_load`, `table_reader`, invariant 12; its place
among the lake's change sequences, `base_sequences`), with what PostgreSQL records of a table's
bases and rebases (`base_state`)."""
