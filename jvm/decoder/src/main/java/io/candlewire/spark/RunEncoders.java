package io.candlewire.spark;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.Map;
import org.apache.spark.TaskContext;

/**
 * Lets go of the state store's encoders that older runs of a query left in this JVM (#34).
 *
 * <p>Spark's RocksDB state store keeps a static cache of data encoders, one per (query run,
 * operator, partition, store, column family), each for an hour after its last use; and each
 * encoder holds the last state value it decoded. The committing query starts a new run, with a
 * new run id, for every commit it hurries (streaming/pacing.py; for every commit when each was
 * an {@code availableNow} run), so every run left one encoder per partition behind, each
 * holding some feed's whole state (its horizon of trade ids, about 250 KB): the soak's heap
 * grew by 20 MB every 8 minutes until the hour was up (docs/benchmarks.md). So the first task of a run in a JVM drops the entries of every other
 * run. An entry of a query still running is not lost with it: its providers keep their
 * encoders, and a new provider makes a new one.
 *
 * <p>The cache is private to Spark, so it is reached by reflection; if this Spark has no such
 * cache, nothing is dropped, and stderr says so once.
 */
final class RunEncoders {
  // A task's job group is its query's run id: StreamExecution sets it on the run's thread.
  private static final String JOB_GROUP = "spark.jobGroup.id";
  private static final String PROVIDER =
      "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider$";
  private static final String CACHE = "dataEncoderCache";

  private static volatile String lastRun;
  private static Map<?, ?> entries; // the cache's live view, once found
  private static Method runOf; // a key's queryRunId()
  private static boolean missing;

  private RunEncoders() {}

  /** Called at each group of a task: cheap unless the task is the first of a new run here. */
  static void forgetOtherRuns() {
    TaskContext task = TaskContext.get();
    String run = task == null ? null : task.getLocalProperty(JOB_GROUP);
    if (run == null || run.equals(lastRun)) {
      return;
    }
    synchronized (RunEncoders.class) {
      if (run.equals(lastRun)) {
        return;
      }
      lastRun = run;
      if (entries == null && !find()) {
        return;
      }
      entries
          .keySet()
          .removeIf(
              k -> {
                try {
                  return !run.equals(runOf.invoke(k));
                } catch (ReflectiveOperationException e) {
                  return false;
                }
              });
    }
  }

  private static boolean find() {
    if (missing) {
      return false;
    }
    try {
      Class<?> provider = Class.forName(PROVIDER);
      Field cacheField = provider.getDeclaredField(CACHE);
      cacheField.setAccessible(true);
      Object cache = cacheField.get(null); // a Scala object's fields are static
      Object guava = cache.getClass().getMethod("cache").invoke(cache);
      Method asMap = guava.getClass().getMethod("asMap");
      asMap.setAccessible(true); // the method of a package-private Guava class
      entries = (Map<?, ?>) asMap.invoke(guava);
      runOf =
          Class.forName("org.apache.spark.sql.execution.streaming.state.StateRowEncoderCacheKey")
              .getMethod("queryRunId");
      return true;
    } catch (ReflectiveOperationException | RuntimeException e) {
      missing = true;
      System.err.println(
          "candlewire: the state store's encoder cache was not found; older runs' encoders stay"
              + " until Spark lets them go ("
              + e
              + ")");
      return false;
    }
  }
}
