"""Starting the user's job with every rank instrumented, and watching it.

``options`` (what ``ddpdoctor run`` was asked), ``torchrun`` (torchrun's own command line, read
with torchrun's parser), ``command`` (the job's command line, environment and log folder),
``job`` (the loop that runs, watches and stops the job), ``monitor`` (each rank's progress
and the hang rules) and ``proctree`` (finding and ending every process of the job).
"""
