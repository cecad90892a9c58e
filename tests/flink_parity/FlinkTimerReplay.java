/*
 * Replays cowmap timer traces against Apache Flink's real InternalTimerServiceImpl.
 *
 * Part of cowmap's test suite (tests/flink_parity/); written for cowmap, not copied from Flink.
 * It sits in Flink's operators package only to reach the timer service's package-private
 * constructor and onProcessingTime, which Flink's StreamTask calls. Compile and run against
 * the flink-dist jar of apache-flink-libraries==2.3.0 (pyflink/lib/flink-dist-2.3.0.jar):
 *
 *     javac -cp flink-dist-2.3.0.jar -d OUT FlinkTimerReplay.java
 *     java -cp OUT:flink-dist-2.3.0.jar org.apache.flink.streaming.api.operators.FlinkTimerReplay < in > out
 *
 * The timer queues are the heap backend's (HeapPriorityQueueSetFactory over key groups
 * [0, 127] of 128, as HeapKeyedStateBackend makes them); keys and namespaces are ints.
 *
 * Input (tests/flink_parity/timer_trace.py writes it and documents it in full):
 *
 *   trace <id>
 *   key <k> | reg <e|p> <ts> <ns> | del <e|p> <ts> <ns> | wm <t> | pt <t>
 *   end
 *
 * Output per trace: "trace <id>", one line "fire <e|p> <ts> <key> <ns>" per timer fired (in
 * firing order), then "left <event timers> <processing timers>" and "end <id>". A firing
 * timer reacts as timer_trace.react says: it may register a timer of its domain for its key
 * and namespace and delete another (Flink's trigger runs with the timer's key current).
 */
package org.apache.flink.streaming.api.operators;

import org.apache.flink.api.common.operators.ProcessingTimeService.ProcessingTimeCallback;
import org.apache.flink.api.common.typeutils.base.IntSerializer;
import org.apache.flink.runtime.metrics.groups.UnregisteredMetricGroups;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.KeyGroupedInternalPriorityQueue;
import org.apache.flink.runtime.state.heap.HeapPriorityQueueSetFactory;
import org.apache.flink.streaming.runtime.tasks.ProcessingTimeService;
import org.apache.flink.streaming.runtime.tasks.StreamTaskCancellationContext;
import org.apache.flink.util.clock.Clock;
import org.apache.flink.util.clock.ManualClock;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Delayed;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

public final class FlinkTimerReplay {

    static final int MAX_PARALLELISM = 128;

    /** A scheduled processing-time timer that never runs by itself: the trace says when time moves. */
    static final class Inert implements ScheduledFuture<Object> {
        @Override public long getDelay(TimeUnit unit) { return 0; }
        @Override public int compareTo(Delayed o) { return 0; }
        @Override public boolean cancel(boolean mayInterrupt) { return true; }
        @Override public boolean isCancelled() { return false; }
        @Override public boolean isDone() { return false; }
        @Override public Object get() { return null; }
        @Override public Object get(long timeout, TimeUnit unit) { return null; }
    }

    static final class TraceTime implements ProcessingTimeService {
        final ManualClock clock = new ManualClock();
        @Override public Clock getClock() { return clock; }
        @Override public long getCurrentProcessingTime() { return clock.absoluteTimeMillis(); }
        @Override public ScheduledFuture<?> registerTimer(long t, ProcessingTimeCallback cb) { return new Inert(); }
        @Override public ScheduledFuture<?> scheduleAtFixedRate(ProcessingTimeCallback cb, long a, long b) { return new Inert(); }
        @Override public ScheduledFuture<?> scheduleWithFixedDelay(ProcessingTimeCallback cb, long a, long b) { return new Inert(); }
        @Override public CompletableFuture<Void> quiesce() { return CompletableFuture.completedFuture(null); }
    }

    static final class Keys implements KeyContext {
        Object current;
        @Override public void setCurrentKey(Object key) { current = key; }
        @Override public Object getCurrentKey() { return current; }
    }

    /** What a firing timer does (timer_trace.react): the same rule on both sides. */
    static void react(InternalTimerServiceImpl<Integer, Integer> svc, boolean event, long ts, int key, int ns) {
        long c = key + ts;
        if (Math.floorMod(c, 3) == 0) {
            long at = ts + 1 + Math.floorMod(c, 4);
            if (event) { svc.registerEventTimeTimer(ns, at); } else { svc.registerProcessingTimeTimer(ns, at); }
        }
        if (Math.floorMod(c, 5) == 0) {
            if (event) { svc.deleteEventTimeTimer(ns, ts + 1); } else { svc.deleteProcessingTimeTimer(ns, ts + 1); }
        }
    }

    @SuppressWarnings("unchecked")
    static InternalTimerServiceImpl<Integer, Integer> service(Keys keys, TraceTime time, PrintWriter out) {
        KeyGroupRange range = KeyGroupRange.of(0, MAX_PARALLELISM - 1);
        HeapPriorityQueueSetFactory factory = new HeapPriorityQueueSetFactory(range, MAX_PARALLELISM, 128);
        TimerSerializer<Integer, Integer> ser = new TimerSerializer<>(IntSerializer.INSTANCE, IntSerializer.INSTANCE);
        KeyGroupedInternalPriorityQueue<TimerHeapInternalTimer<Integer, Integer>> pq =
                (KeyGroupedInternalPriorityQueue<TimerHeapInternalTimer<Integer, Integer>>) (Object) factory.create("_timer_state/processing_t", ser);
        KeyGroupedInternalPriorityQueue<TimerHeapInternalTimer<Integer, Integer>> eq =
                (KeyGroupedInternalPriorityQueue<TimerHeapInternalTimer<Integer, Integer>>) (Object) factory.create("_timer_state/event_t", ser);
        InternalTimerServiceImpl<Integer, Integer> svc = new InternalTimerServiceImpl<>(
                UnregisteredMetricGroups.createUnregisteredTaskMetricGroup().getIOMetricGroup(),
                range, keys, time, pq, eq, StreamTaskCancellationContext.alwaysRunning());
        final InternalTimerServiceImpl<Integer, Integer>[] self = new InternalTimerServiceImpl[] {svc};
        svc.startTimerService(IntSerializer.INSTANCE, IntSerializer.INSTANCE, new Triggerable<Integer, Integer>() {
            @Override
            public void onEventTime(InternalTimer<Integer, Integer> t) {
                fire(true, t);
            }

            @Override
            public void onProcessingTime(InternalTimer<Integer, Integer> t) {
                fire(false, t);
            }

            void fire(boolean event, InternalTimer<Integer, Integer> t) {
                if (!t.getKey().equals(keys.getCurrentKey())) {
                    throw new IllegalStateException("timer key is not the current key");
                }
                out.println("fire " + (event ? "e " : "p ") + t.getTimestamp() + " " + t.getKey() + " " + t.getNamespace());
                react(self[0], event, t.getTimestamp(), t.getKey(), t.getNamespace());
            }
        });
        return svc;
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8)));
        Keys keys = null;
        TraceTime time = null;
        InternalTimerServiceImpl<Integer, Integer> svc = null;
        String id = null;
        String line;
        while ((line = in.readLine()) != null) {
            String[] t = line.trim().split("\\s+");
            if (t.length == 0 || t[0].isEmpty()) {
                continue;
            }
            switch (t[0]) {
                case "trace":
                    id = t[1];
                    keys = new Keys();
                    time = new TraceTime();
                    svc = service(keys, time, out);
                    out.println("trace " + id);
                    break;
                case "key":
                    keys.setCurrentKey(Integer.parseInt(t[1]));
                    break;
                case "reg":
                case "del": {
                    long ts = Long.parseLong(t[2]);
                    int ns = Integer.parseInt(t[3]);
                    boolean event = t[1].equals("e");
                    if (t[0].equals("reg")) {
                        if (event) { svc.registerEventTimeTimer(ns, ts); } else { svc.registerProcessingTimeTimer(ns, ts); }
                    } else {
                        if (event) { svc.deleteEventTimeTimer(ns, ts); } else { svc.deleteProcessingTimeTimer(ns, ts); }
                    }
                    break;
                }
                case "wm":
                    svc.advanceWatermark(Long.parseLong(t[1]));
                    break;
                case "pt":
                    time.clock.advanceTime(Long.parseLong(t[1]) - time.clock.absoluteTimeMillis(), TimeUnit.MILLISECONDS);
                    svc.onProcessingTime(Long.parseLong(t[1]));
                    break;
                case "end":
                    out.println("left " + svc.numEventTimeTimers() + " " + svc.numProcessingTimeTimers());
                    out.println("end " + id);
                    break;
                default:
                    throw new IllegalArgumentException("unknown op " + line);
            }
        }
        out.flush();
    }
}
