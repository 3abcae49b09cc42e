"""What a job is and asks for, as data: the job, the config, the directives, the
environment, the plan and the persisted record. Pure, apart from reading inputs."""
