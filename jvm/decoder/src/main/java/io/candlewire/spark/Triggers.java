package io.candlewire.spark;

import candlewire.v1.Cep.CEPTriggerEvent;
import candlewire.v1.Cep.CEPTriggerRequest;
import candlewire.v1.Cep.CepFeed;
import candlewire.v1.Cep.CepFiring;
import candlewire.v1.Cep.CepFirings;
import candlewire.v1.Cep.CepState;
import candlewire.v1.Cep.TriggerAction;
import candlewire.v1.Envelope.MessageType;
import com.google.protobuf.InvalidProtocolBufferException;
import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.Row;

/**
 * CEP triggers evaluated in the live path of either engine (#19), fed each ticks-topic record
 * as {@link Live} reads it, so a firing leaves the JVM milliseconds after its trade reached
 * Kafka. The rules are the only ones that run; {@code tests/reference/cep.py} is the test's
 * reference they are held to.
 *
 * <p>Every record moves the offset of its partition, and everything here is under one lock, so
 * {@link #state} is always the state after exactly the records before its offsets: a restart
 * goes on from there and makes the same firings with the same numbers (the job records it every
 * {@code stream_cep_record_s}, after sending the firings made before it). Records before the
 * restored offsets are skipped: the live path may have to start earlier than the triggers.
 *
 * <p>Firings wait in a queue that the job's driver drains ({@link #drain}) to send them on and
 * turn them into alerts; a task that finds it long waits (outside the lock) until it shrinks.
 */
public final class Triggers {
  private static final int PENDING_MAX = 65_536;
  private static final byte VERSION = 1;

  private final long allowanceNs;
  private final long horizonNs;
  private final LinkedHashMap<String, FeedTriggers> feeds = new LinkedHashMap<>();
  private final HashMap<String, FeedState> judged = new HashMap<>();
  private final HashMap<Integer, Long> offsets = new HashMap<>();
  private final LinkedBlockingQueue<CepFiring> out = new LinkedBlockingQueue<>();
  private final long startedMs; // the state's line (CepState.started_ms), on every firing
  // A new evaluator's state is recorded once even before it reads: a restart before its
  // first record would start afresh, a line of its own, and make its firings again as new.
  private boolean changed = true;

  Triggers(CepState state, long allowanceNs, long horizonNs) {
    this.allowanceNs = allowanceNs;
    this.horizonNs = horizonNs;
    this.startedMs = state.getStartedMs();
    offsets.putAll(state.getOffsetsMap());
    for (CepFeed f : state.getFeedsList()) {
      FeedTriggers feed = FeedTriggers.restore(f, allowanceNs);
      if (feed == null) {
        continue;
      }
      FeedState j = new FeedState(f.getTicker(), f.getJudgedClockNs());
      for (int i = 0; i < f.getTradeIdsCount(); i++) {
        j.keep(f.getTradeIds(i), f.getTradeTimesNs(i));
      }
      feeds.put(f.getTicker(), feed);
      judged.put(f.getTicker(), j);
    }
  }

  /**
   * An evaluator of its own, outside the live path: tests hold it to {@code tests/reference/cep.py}
   * through py4j with it ({@code tests/streaming/test_cep_jvm.py}).
   */
  public static Triggers open(byte[] state, double allowanceS, double horizonS)
      throws InvalidProtocolBufferException {
    return new Triggers(CepState.parseFrom(state), (long) (allowanceS * 1e9), (long) (horizonS * 1e9));
  }

  /** One ticks-topic record, as the live path hands it on; the firings it made (CepFirings). */
  public byte[] judge(byte[] value, int partition, long offset) throws InterruptedException {
    accept(value, isRegistration(value) ? null : DecodeTick.decode(value), partition, offset);
    return drain(0);
  }

  static boolean isRegistration(byte[] value) {
    return value != null
        && value.length >= 2
        && value[0] == VERSION
        && (value[1] & 0xff) == MessageType.CEP_TRIGGER_REQUEST_VALUE;
  }

  /**
   * One record in its partition's Kafka order: a registration ({@code decoded} null) or what
   * {@link DecodeTick} made of it.
   */
  void accept(byte[] value, Row decoded, int partition, long offset) throws InterruptedException {
    while (out.size() >= PENDING_MAX) {
      Thread.sleep(1); // the driver is behind sending firings: hold this partition back
    }
    synchronized (this) {
      Long next = offsets.get(partition);
      if (next != null && offset < next) {
        return; // judged before the state this run started from
      }
      offsets.put(partition, offset + 1);
      changed = true;
      if (decoded == null) {
        register(value);
        return;
      }
      boolean idle = decoded.getBoolean(DecodeTick.IDLE);
      if (!decoded.getBoolean(DecodeTick.VALID) && !idle) {
        return;
      }
      String ticker = decoded.getString(DecodeTick.TICKER);
      FeedTriggers feed = feeds.get(ticker);
      if (feed == null) {
        return; // no triggers on this feed: the common case
      }
      long timeNs = decoded.getLong(DecodeTick.TIME);
      FeedState j = judged.computeIfAbsent(ticker, t -> new FeedState(t, 0));
      if (idle) {
        j.advance(timeNs, horizonNs);
        send(feed.mark(timeNs));
      } else {
        // Bad before judged, as the live path and the committing query have it: a bad trade
        // must not move this feed's clock or take a trade id.
        BigDecimal[] amounts = DecodeTick.amounts(decoded);
        if (amounts == null) {
          return; // the live path counts it bad
        }
        String tradeId = decoded.getString(DecodeTick.TRADE_ID);
        int verdict = j.admit(tradeId, timeNs, allowanceNs, horizonNs);
        if (verdict == FeedState.KEEP) {
          send(feed.trade(timeNs, amounts[0], amounts[1]));
        } else if (verdict == FeedState.REVISE) {
          feed.revise(timeNs, amounts[0], amounts[1]);
        }
      }
      forgetIfEmpty(ticker);
    }
  }

  private void register(byte[] value) {
    CEPTriggerRequest req;
    try {
      req = CEPTriggerRequest.parseFrom(java.util.Arrays.copyOfRange(value, 2, value.length));
    } catch (InvalidProtocolBufferException e) {
      return; // the desk wrote it; nothing else should, and nothing undecodable fires
    }
    register(req);
  }

  /**
   * An ADD or REMOVE, read among the feed's records or, at a start without a recorded state,
   * from the registry (the job's {@code FiringDesk.restore}).
   */
  synchronized void register(CEPTriggerRequest req) {
    FeedTriggers feed = feeds.get(req.getTicker());
    if (req.getAction() == TriggerAction.REMOVE) {
      if (feed != null) {
        feed.remove(req.getTriggerId());
      }
    } else if (req.getAction() == TriggerAction.ADD) {
      FeedTriggers.Trigger t = FeedTriggers.Trigger.of(req);
      if (t == null) {
        return;
      }
      if (feed == null) {
        feed = new FeedTriggers(req.getTicker(), allowanceNs);
        feeds.put(req.getTicker(), feed);
      }
      feed.add(t);
    }
    forgetIfEmpty(req.getTicker());
  }

  /** A feed whose last trigger went is forgotten, its judged trades too. */
  private void forgetIfEmpty(String ticker) {
    FeedTriggers feed = feeds.get(ticker);
    if (feed != null && feed.size() == 0) {
      feeds.remove(ticker);
      judged.remove(ticker);
    }
  }

  private void send(List<FeedTriggers.Firing> fired) {
    if (fired.isEmpty()) {
      return;
    }
    long nowMs = System.currentTimeMillis();
    for (FeedTriggers.Firing f : fired) {
      CEPTriggerRequest t = f.trigger().request;
      CEPTriggerEvent event =
          CEPTriggerEvent.newBuilder()
              .setTriggerId(t.getTriggerId())
              .setTicker(t.getTicker())
              .setValue(FeedTriggers.plain(f.value()))
              .setFiredTimeMs(nowMs)
              .setEventTimeMs(Math.floorDiv(f.eventTimeNs(), 1_000_000L))
              .setFiring(f.firing())
              .setReference(FeedTriggers.plain(f.reference()))
              .setClientId(t.getClientId())
              .setUserId(t.getUserId())
              .setRegisteredMs(t.getRegisteredMs())
              .setEvaluatorStartedMs(startedMs)
              .build();
      out.add(CepFiring.newBuilder().setTrigger(t).setEvent(event).build());
    }
  }

  /**
   * The firings made so far ({@code CepFirings}), waiting up to {@code waitMs} for the first:
   * the driver's thread that sends them calls this in a loop.
   */
  byte[] drain(long waitMs) throws InterruptedException {
    CepFiring first = out.poll(waitMs, TimeUnit.MILLISECONDS);
    if (first == null) {
      return new byte[0];
    }
    List<CepFiring> batch = new ArrayList<>();
    batch.add(first);
    out.drainTo(batch);
    return CepFirings.newBuilder().addAllFirings(batch).build().toByteArray();
  }

  /**
   * The state after the records before its offsets ({@code CepState}), or null when nothing
   * was read since the last call with {@code onlyIfChanged}. Its firings are queued already.
   */
  public synchronized byte[] state(boolean onlyIfChanged) {
    if (onlyIfChanged && !changed) {
      return null;
    }
    changed = false;
    CepState.Builder b = CepState.newBuilder();
    for (Map.Entry<String, FeedTriggers> e : feeds.entrySet()) {
      CepFeed.Builder f = e.getValue().state();
      FeedState j = judged.get(e.getKey());
      if (j != null) {
        f.setJudgedClockNs(j.clockNs);
        j.forEachSeen((id, t) -> f.addTradeIds(id).addTradeTimesNs(t));
      }
      b.addFeeds(f);
    }
    b.putAllOffsets(offsets).setStartedMs(startedMs);
    return b.build().toByteArray();
  }
}
