import json
import sys
from pathlib import Path
from statistics import mean

from fl_app.run.outputs import write_csv
from strategies.rounds import sample_partitions

runs = Path(sys.argv[1])
rows = []
for ref in sorted(runs.glob("fedtopo/seed*/summary.json")):
    seed = json.loads(ref.read_text())["seed"]
    s = json.loads(ref.read_text())
    times = [0] * s["num_clients"]
    for r in range(1, s["rounds"] + 1):
        for p in sample_partitions(range(s["num_clients"]), s["clients_per_round"], seed, r):
            times[p] += 1
    topo = s["client_accuracy"]
    for summary in sorted(runs.glob(f"*/seed{seed}/summary.json")):
        m = json.loads(summary.read_text())
        acc = m["client_accuracy"]
        trained = [i for i, t in enumerate(times) if t > 0]
        rows.append(
            {
                "seed": seed,
                "method": m["method"],
                "clients": len(acc),
                "never_trained": len(acc) - len(trained),
                "same_accuracy_as_fedtopo": sum(a == b for a, b in zip(acc, topo)),
                "trained_same_accuracy_as_fedtopo": sum(acc[i] == topo[i] for i in trained),
                "accuracy_trained": round(mean(acc[i] for i in trained), 4),
                "accuracy_never_trained": round(mean(a for a, t in zip(acc, times) if t == 0), 4),
            }
        )
write_csv(runs.parent / "participation.csv", rows)  # a new file: never over an existing one or through a symlink
print(open(runs.parent / "participation.csv").read())
