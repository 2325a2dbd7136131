"""`localcos eval`: code tasks completed by several configurations of one loaded ensemble, each
program run in a sandbox (`sandbox`, `launcher`), results kept as they come (`results`) and
compared problem by problem (`summary`, `paired`)."""
