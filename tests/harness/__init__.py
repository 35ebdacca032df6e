"""What tests (and the test scripts in tests/) share: real Flower processes started, waited for and stopped with
everything they spawned (``deployment``), a real run stopped right after a given checkpoint (``stopping``),
in-process runs (``in_process``), stand-in runs of a suite (``suites``), a FEAST client's training inputs
(``training``) and the repository's files (``repository``). Nothing here is part of the app."""
