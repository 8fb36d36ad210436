"""What a process takes from its host: socket polling constants and free ports (``netutil``),
the guardian that stops a process's children when it dies (``guardian``), and the allocator
setting that keeps freed memory for reuse (``allocator``). Imported by the roles; imports
nothing of the project."""
