"""What gpuwatch knows of XIDs, in one place below every source that reports them: NVIDIA's
catalog (generated from catalog.tsv), what each class means for a GPU's verdict, the text
an XID event carries, and how XIDs are counted as series."""
