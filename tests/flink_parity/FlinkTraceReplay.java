/*
 * Replays cowmap parity traces against Apache Flink's real heap keyed state backend.
 *
 * Part of cowmap's test suite (tests/flink_parity/); written for cowmap, not copied from Flink.
 * Compile and run against the flink-dist jar shipped in the PyPI package
 * apache-flink-libraries==2.3.0 (pyflink/lib/flink-dist-2.3.0.jar):
 *
 *     javac -cp flink-dist-2.3.0.jar -d OUT FlinkTraceReplay.java
 *     java -cp OUT:flink-dist-2.3.0.jar FlinkTraceReplay < traces.txt > results.txt
 *
 * The backend is a HeapKeyedStateBackend built by HeapKeyedStateBackendBuilder with exactly the
 * arguments HashMapStateBackend.createKeyedStateBackend passes (minus the task Environment, which
 * only supplies the class loader, ExecutionConfig and a disabled local-recovery config): key
 * serializer IntSerializer, 128 key groups, key-group range [0, 127], a TtlTimeProvider whose time
 * the trace sets, asynchronous snapshots.
 *
 * The text format (shared with tests/flink_parity/trace.py, which documents it in full):
 *
 *   trace <id> kind=<value|list|map|reducing|aggregating> ttl=<ms|none>
 *         upd=<OnCreateAndWrite|OnReadAndWrite> vis=<NeverReturnExpired|ReturnExpiredIfNotCleanedUp>
 *         calls=<comma-separated TTL builder calls, in order: full | inc:<size>:<0|1> | nobg; or ->
 *   <one operation per line>
 *   end
 *
 * Output per trace: "trace <id>", then one line "<op index> <result>" per read (and per failed
 * operation: "<op index> error <exception class>: <message>"), then "end <id>".
 * Keys, namespaces and user keys are ints (IntSerializer); values are longs.
 */

import org.apache.flink.api.common.ExecutionConfig;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.ReduceFunction;
import org.apache.flink.api.common.state.AggregatingState;
import org.apache.flink.api.common.state.AggregatingStateDescriptor;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ReducingState;
import org.apache.flink.api.common.state.ReducingStateDescriptor;
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
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.KeyedStateHandle;
import org.apache.flink.runtime.state.LocalRecoveryConfig;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.UncompressedStreamCompressionDecorator;
import org.apache.flink.runtime.state.heap.HeapKeyedStateBackend;
import org.apache.flink.runtime.state.heap.HeapKeyedStateBackendBuilder;
import org.apache.flink.runtime.state.heap.HeapPriorityQueueSetFactory;
import org.apache.flink.runtime.state.internal.InternalKvState;
import org.apache.flink.runtime.state.internal.InternalMergingState;
import org.apache.flink.runtime.state.memory.MemCheckpointStreamFactory;
import org.apache.flink.runtime.state.metrics.LatencyTrackingStateConfig;
import org.apache.flink.runtime.state.metrics.SizeTrackingStateConfig;
import org.apache.flink.runtime.state.ttl.TtlTimeProvider;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.RunnableFuture;

public final class FlinkTraceReplay {

    static final int MAX_PARALLELISM = 128;
    static final String STATE_NAME = "s";

    /** The trace's clock. */
    static final class ManualClock implements TtlTimeProvider {
        long now;

        @Override
        public long currentTimestamp() {
            return now;
        }
    }

    /** Sum and count of the added longs; the result prints as "sum/count". */
    static final class SumCount implements AggregateFunction<Long, Tuple2<Long, Long>, String> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple2<Long, Long> createAccumulator() {
            return Tuple2.of(0L, 0L);
        }

        @Override
        public Tuple2<Long, Long> add(Long value, Tuple2<Long, Long> acc) {
            return Tuple2.of(acc.f0 + value, acc.f1 + 1);
        }

        @Override
        public String getResult(Tuple2<Long, Long> acc) {
            return acc.f0 + "/" + acc.f1;
        }

        @Override
        public Tuple2<Long, Long> merge(Tuple2<Long, Long> a, Tuple2<Long, Long> b) {
            return Tuple2.of(a.f0 + b.f0, a.f1 + b.f1);
        }
    }

    /** Header of one trace. */
    static final class Header {
        String id;
        String kind;
        Long ttlMs; // null: no TTL
        String updateType = "OnCreateAndWrite";
        String visibility = "NeverReturnExpired";
        List<String> calls = new ArrayList<>();

        static Header parse(String line) {
            String[] tok = line.trim().split("\\s+");
            Header h = new Header();
            h.id = tok[1];
            for (int i = 2; i < tok.length; i++) {
                int eq = tok[i].indexOf('=');
                String k = tok[i].substring(0, eq);
                String v = tok[i].substring(eq + 1);
                switch (k) {
                    case "kind": h.kind = v; break;
                    case "ttl": h.ttlMs = v.equals("none") ? null : Long.parseLong(v); break;
                    case "upd": h.updateType = v; break;
                    case "vis": h.visibility = v; break;
                    case "calls":
                        if (!v.equals("-")) {
                            for (String c : v.split(",")) {
                                h.calls.add(c);
                            }
                        }
                        break;
                    default: throw new IllegalArgumentException("unknown header field " + k);
                }
            }
            return h;
        }

        StateTtlConfig ttlConfig() {
            StateTtlConfig.Builder b = StateTtlConfig.newBuilder(Duration.ofMillis(ttlMs))
                    .setUpdateType(StateTtlConfig.UpdateType.valueOf(updateType))
                    .setStateVisibility(StateTtlConfig.StateVisibility.valueOf(visibility));
            for (String c : calls) {
                String[] p = c.split(":");
                switch (p[0]) {
                    case "full": b.cleanupFullSnapshot(); break;
                    case "nobg": b.disableCleanupInBackground(); break;
                    case "inc": b.cleanupIncrementally(Integer.parseInt(p[1]), p[2].equals("1")); break;
                    default: throw new IllegalArgumentException("unknown builder call " + c);
                }
            }
            return b.build();
        }

        /** A fresh descriptor (Flink initialises serializers inside descriptors, so never reuse one). */
        StateDescriptor<?, ?> descriptor() {
            StateDescriptor<?, ?> d;
            switch (kind) {
                case "value":
                    d = new ValueStateDescriptor<>(STATE_NAME, LongSerializer.INSTANCE);
                    break;
                case "list":
                    d = new ListStateDescriptor<>(STATE_NAME, LongSerializer.INSTANCE);
                    break;
                case "map":
                    d = new MapStateDescriptor<>(STATE_NAME, IntSerializer.INSTANCE, LongSerializer.INSTANCE);
                    break;
                case "reducing":
                    d = new ReducingStateDescriptor<>(STATE_NAME, (ReduceFunction<Long>) Long::sum, LongSerializer.INSTANCE);
                    break;
                case "aggregating": {
                    @SuppressWarnings({"unchecked", "rawtypes"})
                    TypeSerializer<Tuple2<Long, Long>> accSer = new TupleSerializer<Tuple2<Long, Long>>(
                            (Class) Tuple2.class,
                            new TypeSerializer<?>[] {LongSerializer.INSTANCE, LongSerializer.INSTANCE});
                    d = new AggregatingStateDescriptor<>(STATE_NAME, new SumCount(), accSer);
                    break;
                }
                default: throw new IllegalArgumentException("unknown state kind " + kind);
            }
            if (ttlMs != null) {
                d.enableTimeToLive(ttlConfig());
            }
            return d;
        }
    }

    /** One trace's backend, state handle and cursor (current key / namespace). */
    static final class Replay {
        final Header h;
        final ManualClock clock = new ManualClock();
        HeapKeyedStateBackend<Integer> backend;
        Object state;
        Integer currentKey;
        Integer currentNs;
        KeyedStateHandle heldSnapshot;
        boolean haveHeldSnapshot;
        long checkpointId;

        Replay(Header h) throws Exception {
            this.h = h;
            open(Collections.emptyList());
        }

        void open(Collection<KeyedStateHandle> handles) throws Exception {
            KeyGroupRange range = KeyGroupRange.of(0, MAX_PARALLELISM - 1);
            backend = new HeapKeyedStateBackendBuilder<>(
                    null,
                    IntSerializer.INSTANCE,
                    FlinkTraceReplay.class.getClassLoader(),
                    MAX_PARALLELISM,
                    range,
                    new ExecutionConfig(),
                    clock,
                    LatencyTrackingStateConfig.disabled(),
                    SizeTrackingStateConfig.disabled(),
                    handles,
                    UncompressedStreamCompressionDecorator.INSTANCE,
                    LocalRecoveryConfig.BACKUP_AND_RECOVERY_DISABLED,
                    new HeapPriorityQueueSetFactory(range, MAX_PARALLELISM, 128),
                    true,
                    new CloseableRegistry()).build();
            state = backend.getOrCreateKeyedState(IntSerializer.INSTANCE, h.descriptor());
            if (currentKey != null) {
                backend.setCurrentKey(currentKey);
            }
            if (currentNs != null) {
                kv().setCurrentNamespace(currentNs);
            }
        }

        void close() throws Exception {
            backend.dispose();
            backend.close();
        }

        @SuppressWarnings("unchecked")
        InternalKvState<Integer, Integer, ?> kv() {
            return (InternalKvState<Integer, Integer, ?>) state;
        }

        @SuppressWarnings("unchecked")
        InternalMergingState<Integer, Integer, ?, ?, ?> merging() {
            return (InternalMergingState<Integer, Integer, ?, ?, ?>) state;
        }

        /** Takes a snapshot and materialises it at once (the async part runs now, at this time). */
        KeyedStateHandle snapshot() throws Exception {
            RunnableFuture<SnapshotResult<KeyedStateHandle>> f = backend.snapshot(
                    ++checkpointId, clock.now, new MemCheckpointStreamFactory(64 << 20),
                    CheckpointOptions.forCheckpointWithDefaultLocation());
            f.run();
            return f.get().getJobManagerOwnedSnapshot();
        }

        void restore(KeyedStateHandle handle) throws Exception {
            close();
            open(handle == null ? Collections.<KeyedStateHandle>emptyList() : Collections.singletonList(handle));
        }

        /** Runs one op; returns the output line's payload, or null for a write. */
        @SuppressWarnings("unchecked")
        String run(String[] t) throws Exception {
            String op = t[0];
            switch (op) {
                case "time": clock.now = Long.parseLong(t[1]); return null;
                case "key": currentKey = Integer.parseInt(t[1]); backend.setCurrentKey(currentKey); return null;
                case "ns": currentNs = Integer.parseInt(t[1]); kv().setCurrentNamespace(currentNs); return null;
                case "snap": heldSnapshot = snapshot(); haveHeldSnapshot = true; return null;
                case "restore":
                    if (!haveHeldSnapshot) {
                        throw new IllegalStateException("restore without snap");
                    }
                    restore(heldSnapshot);
                    return null;
                case "snaprestore": restore(snapshot()); return null;
                default: break;
            }
            switch (h.kind) {
                case "value": {
                    ValueState<Long> s = (ValueState<Long>) state;
                    switch (op) {
                        case "get": return str(s.value());
                        case "update": s.update(Long.parseLong(t[1])); return null;
                        case "clear": s.clear(); return null;
                        default: break;
                    }
                    break;
                }
                case "list": {
                    ListState<Long> s = (ListState<Long>) state;
                    switch (op) {
                        case "get": {
                            Iterable<Long> it = s.get();
                            List<Long> out = new ArrayList<>();
                            if (it != null) {
                                for (Long v : it) {
                                    out.add(v);
                                }
                            }
                            return listStr(out);
                        }
                        case "add": s.add(Long.parseLong(t[1])); return null;
                        case "addall": s.addAll(longs(t, 1)); return null;
                        case "update": s.update(longs(t, 1)); return null;
                        case "clear": s.clear(); return null;
                        case "merge": merge(t); return null;
                        default: break;
                    }
                    break;
                }
                case "map": {
                    MapState<Integer, Long> s = (MapState<Integer, Long>) state;
                    switch (op) {
                        case "get": return str(s.get(Integer.parseInt(t[1])));
                        case "put": s.put(Integer.parseInt(t[1]), Long.parseLong(t[2])); return null;
                        case "putall": {
                            Map<Integer, Long> m = new LinkedHashMap<>();
                            for (int i = 1; i + 1 < t.length; i += 2) {
                                m.put(Integer.parseInt(t[i]), Long.parseLong(t[i + 1]));
                            }
                            s.putAll(m);
                            return null;
                        }
                        case "remove": s.remove(Integer.parseInt(t[1])); return null;
                        case "contains": return Boolean.toString(s.contains(Integer.parseInt(t[1])));
                        case "entries": {
                            TreeMap<Integer, Long> sorted = new TreeMap<>();
                            for (Map.Entry<Integer, Long> e : s.entries()) {
                                if (sorted.put(e.getKey(), e.getValue()) != null) {
                                    throw new IllegalStateException("duplicate user key " + e.getKey());
                                }
                            }
                            StringBuilder sb = new StringBuilder("{");
                            for (Map.Entry<Integer, Long> e : sorted.entrySet()) {
                                if (sb.length() > 1) {
                                    sb.append(',');
                                }
                                sb.append(e.getKey()).append(':').append(e.getValue());
                            }
                            return sb.append('}').toString();
                        }
                        case "keys": {
                            List<Long> out = new ArrayList<>();
                            for (Integer k : s.keys()) {
                                out.add((long) k);
                            }
                            Collections.sort(out);
                            return listStr(out);
                        }
                        case "values": {
                            List<Long> out = new ArrayList<>();
                            for (Long v : s.values()) {
                                out.add(v);
                            }
                            Collections.sort(out);
                            return listStr(out);
                        }
                        case "isempty": return Boolean.toString(s.isEmpty());
                        case "clear": s.clear(); return null;
                        default: break;
                    }
                    break;
                }
                case "reducing": {
                    ReducingState<Long> s = (ReducingState<Long>) state;
                    switch (op) {
                        case "get": return str(s.get());
                        case "add": s.add(Long.parseLong(t[1])); return null;
                        case "clear": s.clear(); return null;
                        case "merge": merge(t); return null;
                        default: break;
                    }
                    break;
                }
                case "aggregating": {
                    AggregatingState<Long, String> s = (AggregatingState<Long, String>) state;
                    switch (op) {
                        case "get": {
                            String r = s.get();
                            return r == null ? "null" : r;
                        }
                        case "add": s.add(Long.parseLong(t[1])); return null;
                        case "clear": s.clear(); return null;
                        case "merge": merge(t); return null;
                        default: break;
                    }
                    break;
                }
                default: break;
            }
            throw new IllegalArgumentException("unknown op '" + op + "' for kind " + h.kind);
        }

        void merge(String[] t) throws Exception {
            List<Integer> sources = new ArrayList<>();
            for (int i = 2; i < t.length; i++) {
                sources.add(Integer.parseInt(t[i]));
            }
            merging().mergeNamespaces(Integer.parseInt(t[1]), sources);
        }
    }

    static List<Long> longs(String[] t, int from) {
        List<Long> out = new ArrayList<>();
        for (int i = from; i < t.length; i++) {
            out.add(Long.parseLong(t[i]));
        }
        return out;
    }

    static String str(Object v) {
        return v == null ? "null" : v.toString();
    }

    static String listStr(List<Long> values) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < values.size(); i++) {
            if (i > 0) {
                sb.append(',');
            }
            sb.append(values.get(i));
        }
        return sb.append(']').toString();
    }

    static String errorLine(Throwable e) {
        String msg = String.valueOf(e.getMessage()).replace('\n', ' ');
        return "error " + e.getClass().getSimpleName() + ": " + msg;
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8)));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            if (!line.startsWith("trace ")) {
                throw new IllegalArgumentException("expected a trace header, got: " + line);
            }
            Header h = Header.parse(line);
            List<String[]> ops = new ArrayList<>();
            while ((line = in.readLine()) != null) {
                line = line.trim();
                if (line.isEmpty() || line.startsWith("#")) {
                    continue;
                }
                if (line.equals("end")) {
                    break;
                }
                ops.add(line.split("\\s+"));
            }
            out.println("trace " + h.id);
            Replay r = null;
            try {
                r = new Replay(h);
                for (int i = 0; i < ops.size(); i++) {
                    String result;
                    try {
                        result = r.run(ops.get(i));
                    } catch (Exception e) {
                        result = errorLine(e);
                    }
                    if (result != null) {
                        out.println(i + " " + result);
                    }
                }
            } catch (Exception e) {
                out.println("-1 " + errorLine(e));
            } finally {
                if (r != null) {
                    try {
                        r.close();
                    } catch (Exception ignored) {
                        // best effort
                    }
                }
            }
            out.println("end " + h.id);
            out.flush();
        }
        out.flush();
    }
}
