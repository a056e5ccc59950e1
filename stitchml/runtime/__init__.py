"""Runtimes: the eager interpreter and the asynchronous run queue."""
