/*
 * The Flink side of cowmap's `ttl` benchmark (python -m cowmap.bench --with-flink).
 *
 * Written for cowmap (not copied from Flink). It runs the harness's workload against Apache
 * Flink 2.3's real heap keyed state backend (HeapKeyedStateBackend, built by
 * HeapKeyedStateBackendBuilder as HashMapStateBackend does; see
 * tests/flink_parity/FlinkTraceReplay.java) with a manual TtlTimeProvider. The harness compiles
 * it at run time against pyflink/lib/flink-dist-2.3.0.jar (PyPI: apache-flink-libraries==2.3.0):
 *
 *     javac -cp flink-dist-2.3.0.jar -d OUT FlinkStateBench.java
 *     java -cp OUT:flink-dist-2.3.0.jar FlinkStateBench plan.txt
 *
 * The plan (written by cowmap/bench/flink.py) is one directive per line:
 *
 *     ttl_ms <ms>                 TTL of the TTL states (nothing expires during a run)
 *     repeats <n>                 timed rounds per config (after warm-up)
 *     min_records <n>             at least this many records per round
 *     round_budget_ms <ms>        at most about this long per round: slow configs time a prefix
 *     warmup_ms <ms>              JIT warm-up per config (the whole prefix at least once)
 *     point <entries/key> <groups> <users> <n records> <records file>
 *     batch <layout>:<ttl> ...    configs built and measured together (rounds interleaved);
 *                                 layout value|map, ttl off|default|every
 *
 * The records file holds <n records> little-endian int32 triples (group, user, value), the very
 * records the Python side replays. One record is a read-modify-write of the state of (group,
 * user): ValueState keyed by Tuple2(group, user): setCurrentKey(key); update(value() + v);
 * MapState keyed by group: setCurrentKey(group); put(user, get(user) + v). Every state is filled
 * with value 0 for all groups x users first, so all records hit; afterwards every entry is read
 * back to count the entries alive and the sum of the values (the expected sum is known).
 *
 * Output: one JSON object per config on stdout, prefixed "RESULT "; "PROGRESS <text>" lines on
 * stderr after each unit of work (a build, one round of a batch, a check).
 */

import org.apache.flink.api.common.ExecutionConfig;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.StateDescriptor;
import org.apache.flink.api.common.state.StateTtlConfig;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.base.IntSerializer;
import org.apache.flink.api.common.typeutils.base.LongSerializer;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.typeutils.runtime.TupleSerializer;
import org.apache.flink.core.fs.CloseableRegistry;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.LocalRecoveryConfig;
import org.apache.flink.runtime.state.UncompressedStreamCompressionDecorator;
import org.apache.flink.runtime.state.VoidNamespace;
import org.apache.flink.runtime.state.VoidNamespaceSerializer;
import org.apache.flink.runtime.state.heap.HeapKeyedStateBackend;
import org.apache.flink.runtime.state.heap.HeapKeyedStateBackendBuilder;
import org.apache.flink.runtime.state.heap.HeapPriorityQueueSetFactory;
import org.apache.flink.runtime.state.metrics.LatencyTrackingStateConfig;
import org.apache.flink.runtime.state.metrics.SizeTrackingStateConfig;
import org.apache.flink.runtime.state.ttl.TtlTimeProvider;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

public final class FlinkStateBench {

    static final int MAX_PARALLELISM = 128; // cowmap's KeyedStateBackend default

    static long ttlMs = 3_600_000L;
    static int repeats = 5;
    static int minRecords = 200;
    static long roundBudgetNs = 250_000_000L;
    static long warmupNs = 300_000_000L;
    static int progress;

    static final class ManualClock implements TtlTimeProvider {
        long now;

        @Override
        public long currentTimestamp() {
            return now;
        }
    }

    /** One sweep point's records, as parallel int arrays. */
    static final class Records {
        final int[] g;
        final int[] u;
        final int[] v;

        Records(Path file, int n) throws IOException {
            g = new int[n];
            u = new int[n];
            v = new int[n];
            ByteBuffer buf;
            try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
                buf = ch.map(FileChannel.MapMode.READ_ONLY, 0, 12L * n).order(ByteOrder.LITTLE_ENDIAN);
            }
            for (int i = 0; i < n; i++) {
                g[i] = buf.getInt();
                u[i] = buf.getInt();
                v[i] = buf.getInt();
            }
        }
    }

    /** One layout x TTL setting: its own backend, filled, then timed. */
    abstract static class Config {
        final String layout;
        final String ttl;
        final ManualClock clock;
        HeapKeyedStateBackend<Object> backend;
        int n; // records per round (a prefix of the point's records)
        long sumExpected;
        long warmupRecords;
        long buildNs;
        long memBytes;
        final List<Double> nsPerRecord = new ArrayList<>();

        Config(String layout, String ttl, ManualClock clock) {
            this.layout = layout;
            this.ttl = ttl;
            this.clock = clock;
        }

        StateTtlConfig ttlConfig() {
            StateTtlConfig.Builder b = StateTtlConfig.newBuilder(Duration.ofMillis(ttlMs));
            if (ttl.equals("every")) {
                b.cleanupIncrementally(5, true);
            } // "default": Flink's defaults (background cleanup = incremental, 5 entries per access)
            return b.build();
        }

        <D extends StateDescriptor<?, ?>> D withTtl(D d) {
            if (!ttl.equals("off")) {
                d.enableTimeToLive(ttlConfig());
            }
            return d;
        }

        @SuppressWarnings({"unchecked", "rawtypes"})
        void open(TypeSerializer<?> keySerializer) throws Exception {
            KeyGroupRange range = KeyGroupRange.of(0, MAX_PARALLELISM - 1);
            backend = new HeapKeyedStateBackendBuilder<>(
                    null,
                    (TypeSerializer) keySerializer,
                    FlinkStateBench.class.getClassLoader(),
                    MAX_PARALLELISM,
                    range,
                    new ExecutionConfig(),
                    clock,
                    LatencyTrackingStateConfig.disabled(),
                    SizeTrackingStateConfig.disabled(),
                    Collections.emptyList(),
                    UncompressedStreamCompressionDecorator.INSTANCE,
                    LocalRecoveryConfig.BACKUP_AND_RECOVERY_DISABLED,
                    new HeapPriorityQueueSetFactory(range, MAX_PARALLELISM, 128),
                    true,
                    new CloseableRegistry()).build();
        }

        abstract void build(int groups, int users) throws Exception;

        /** Replays records [from, to). */
        abstract void run(Records r, int from, int to) throws Exception;

        /** {entries alive, sum of their values}. */
        abstract long[] check(int groups, int users) throws Exception;

        void close() throws Exception {
            backend.dispose();
            backend.close();
            backend = null;
        }
    }

    static final class ValueConfig extends Config {
        ValueState<Long> state;

        ValueConfig(String ttl, ManualClock clock) {
            super("value", ttl, clock);
        }

        @Override
        @SuppressWarnings({"unchecked", "rawtypes"})
        void build(int groups, int users) throws Exception {
            open(new TupleSerializer<Tuple2<Integer, Integer>>((Class) Tuple2.class,
                    new TypeSerializer<?>[] {IntSerializer.INSTANCE, IntSerializer.INSTANCE}));
            state = backend.getPartitionedState(VoidNamespace.INSTANCE, VoidNamespaceSerializer.INSTANCE,
                    withTtl(new ValueStateDescriptor<>("v", LongSerializer.INSTANCE)));
            Long zero = 0L;
            for (int g = 0; g < groups; g++) {
                for (int u = 0; u < users; u++) {
                    backend.setCurrentKey(Tuple2.of(g, u));
                    state.update(zero);
                }
            }
        }

        @Override
        void run(Records r, int from, int to) throws Exception {
            final int[] gs = r.g, us = r.u, vs = r.v;
            final HeapKeyedStateBackend<Object> b = backend;
            final ValueState<Long> s = state;
            for (int i = from; i < to; i++) {
                b.setCurrentKey(Tuple2.of(gs[i], us[i]));
                s.update(s.value() + vs[i]);
            }
        }

        @Override
        long[] check(int groups, int users) throws Exception {
            long alive = 0, sum = 0;
            for (int g = 0; g < groups; g++) {
                for (int u = 0; u < users; u++) {
                    backend.setCurrentKey(Tuple2.of(g, u));
                    Long x = state.value();
                    if (x != null) {
                        alive++;
                        sum += x;
                    }
                }
            }
            return new long[] {alive, sum};
        }
    }

    static final class MapConfig extends Config {
        MapState<Integer, Long> state;

        MapConfig(String ttl, ManualClock clock) {
            super("map", ttl, clock);
        }

        @Override
        void build(int groups, int users) throws Exception {
            open(IntSerializer.INSTANCE);
            state = backend.getPartitionedState(VoidNamespace.INSTANCE, VoidNamespaceSerializer.INSTANCE,
                    withTtl(new MapStateDescriptor<>("m", IntSerializer.INSTANCE, LongSerializer.INSTANCE)));
            // one putAll per group, like cowmap's fill (put_all): with TTL every state access
            // runs a cleanup step, which copies whole user maps, so a put per entry would be slow
            Map<Integer, Long> zeros = new HashMap<>();
            for (int u = 0; u < users; u++) {
                zeros.put(u, 0L);
            }
            for (int g = 0; g < groups; g++) {
                backend.setCurrentKey(g);
                state.putAll(zeros);
            }
        }

        @Override
        void run(Records r, int from, int to) throws Exception {
            final int[] gs = r.g, us = r.u, vs = r.v;
            final HeapKeyedStateBackend<Object> b = backend;
            final MapState<Integer, Long> s = state;
            for (int i = from; i < to; i++) {
                b.setCurrentKey(gs[i]);
                Integer u = us[i];
                s.put(u, s.get(u) + vs[i]);
            }
        }

        @Override
        long[] check(int groups, int users) throws Exception {
            long alive = 0, sum = 0;
            for (int g = 0; g < groups; g++) {
                backend.setCurrentKey(g);
                for (Map.Entry<Integer, Long> e : state.entries()) {
                    alive++;
                    sum += e.getValue();
                }
            }
            return new long[] {alive, sum};
        }
    }

    static long usedHeap() {
        Runtime rt = Runtime.getRuntime();
        for (int i = 0; i < 3; i++) {
            System.gc();
        }
        return rt.totalMemory() - rt.freeMemory();
    }

    static void progress(String what) {
        System.err.println("PROGRESS " + (++progress) + " " + what);
        System.err.flush();
    }

    static long sumOf(Records r, int n) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += r.v[i];
        }
        return s;
    }

    static void runBatch(int e, int groups, int users, int nRecords, Records recs, List<String> specs)
            throws Exception {
        ManualClock clock = new ManualClock();
        List<Config> configs = new ArrayList<>();
        for (String spec : specs) {
            String[] p = spec.split(":");
            configs.add(p[0].equals("value") ? new ValueConfig(p[1], clock) : new MapConfig(p[1], clock));
        }
        String where = " @" + e + "/key";
        for (Config c : configs) {
            long m0 = usedHeap();
            long t0 = System.nanoTime();
            c.build(groups, users);
            c.buildNs = System.nanoTime() - t0;
            c.memBytes = usedHeap() - m0;
            progress("flink build " + c.layout + " " + c.ttl + where);
        }
        // warm-up (JIT): the first pass also picks how many records fit the round budget
        for (Config c : configs) {
            clock.now++;
            long t0 = System.nanoTime();
            int done = 0;
            int chunk = Math.max(1, Math.min(minRecords, nRecords));
            while (done < nRecords) {
                int upto = Math.min(nRecords, done + chunk);
                c.run(recs, done, upto);
                done = upto;
                if (done >= minRecords && System.nanoTime() - t0 > roundBudgetNs) {
                    break;
                }
            }
            c.n = done;
            c.sumExpected += sumOf(recs, done);
            c.warmupRecords += done;
            long sumN = sumOf(recs, c.n);
            while (System.nanoTime() - t0 < warmupNs) {
                clock.now++;
                c.run(recs, 0, c.n);
                c.sumExpected += sumN;
                c.warmupRecords += c.n;
            }
            progress("flink warm-up " + c.layout + " " + c.ttl + where);
        }
        for (int rep = 0; rep < repeats; rep++) {
            clock.now++;
            for (Config c : configs) {
                long t0 = System.nanoTime();
                c.run(recs, 0, c.n);
                long dt = System.nanoTime() - t0;
                c.nsPerRecord.add((double) dt / c.n);
                c.sumExpected += sumOf(recs, c.n);
            }
            progress("flink round " + (rep + 1) + "/" + repeats + where);
        }
        for (Config c : configs) {
            long[] found = c.check(groups, users);
            StringBuilder sb = new StringBuilder("RESULT {");
            sb.append("\"system\": \"flink\", \"layout\": \"").append(c.layout)
                    .append("\", \"ttl\": \"").append(c.ttl)
                    .append("\", \"entries_per_key\": ").append(e)
                    .append(", \"groups\": ").append(groups)
                    .append(", \"users_per_group\": ").append(users)
                    .append(", \"records_per_round\": ").append(c.n)
                    .append(", \"warmup_records\": ").append(c.warmupRecords)
                    .append(", \"ns_per_record\": [");
            for (int i = 0; i < c.nsPerRecord.size(); i++) {
                sb.append(i > 0 ? ", " : "").append(String.format("%.1f", c.nsPerRecord.get(i)));
            }
            sb.append("], \"build_s\": ").append(String.format("%.3f", c.buildNs / 1e9))
                    .append(", \"mem_bytes\": ").append(c.memBytes)
                    .append(", \"alive\": ").append(found[0])
                    .append(", \"expected\": ").append((long) groups * users)
                    .append(", \"value_sum\": ").append(found[1])
                    .append(", \"value_sum_expected\": ").append(c.sumExpected)
                    .append("}");
            System.out.println(sb);
            System.out.flush();
            c.close();
            progress("flink check " + c.layout + " " + c.ttl + where);
        }
    }

    public static void main(String[] args) throws Exception {
        List<String> lines = Files.readAllLines(Paths.get(args[0]));
        int e = 0, groups = 0, users = 0, n = 0;
        Records recs = null;
        for (String raw : lines) {
            String line = raw.trim();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String[] t = line.split("\\s+");
            switch (t[0]) {
                case "ttl_ms": ttlMs = Long.parseLong(t[1]); break;
                case "repeats": repeats = Integer.parseInt(t[1]); break;
                case "min_records": minRecords = Integer.parseInt(t[1]); break;
                case "round_budget_ms": roundBudgetNs = Long.parseLong(t[1]) * 1_000_000L; break;
                case "warmup_ms": warmupNs = Long.parseLong(t[1]) * 1_000_000L; break;
                case "point":
                    e = Integer.parseInt(t[1]);
                    groups = Integer.parseInt(t[2]);
                    users = Integer.parseInt(t[3]);
                    n = Integer.parseInt(t[4]);
                    recs = null;
                    System.gc();
                    recs = new Records(Paths.get(t[5]), n);
                    break;
                case "batch": {
                    List<String> specs = new ArrayList<>();
                    for (int i = 1; i < t.length; i++) {
                        specs.add(t[i]);
                    }
                    runBatch(e, groups, users, n, recs, specs);
                    break;
                }
                default: throw new IllegalArgumentException("unknown plan directive: " + line);
            }
        }
    }
}
