"""What tests (and the test scripts in tests/) use to drive real Flower processes: start them, wait for them, stop
them and everything they spawned. Nothing here is part of the app."""
