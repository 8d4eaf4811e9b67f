"""Names of the environment variables the launcher uses to configure every rank."""

LOGDIR = "DDPDOCTOR_LOGDIR"
RUN_ID = "DDPDOCTOR_RUN_ID"
BACKEND = "DDPDOCTOR_BACKEND"
