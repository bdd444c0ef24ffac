package io.candlewire.spark;

import candlewire.v1.Envelope.MessageType;
import candlewire.v1.Journal.JournalBatch;
import candlewire.v1.MarketOuterClass.OHLC;
import candlewire.v1.MarketOuterClass.StreamHead;
import candlewire.v1.MarketOuterClass.StreamPosition;
import candlewire.v1.MarketOuterClass.Tick;
import com.google.protobuf.CodedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.zeromq.SocketType;
import org.zeromq.ZContext;
import org.zeromq.ZMQ;

/**
 * What {@code streaming/publisher.py} does for the micro-batch live path, for the real-time
 * one: each market-data message gets its position (epoch, per-topic seq, and for ticks the
 * Kafka record it came from), goes into the journal ({@code candlewire.live}, one {@code
 * JournalBatch} per topic and round) and then out of an XPUB that never blocks and counts what
 * a full relay queue could not take ({@code XPUB_NODROP}). Used by one thread only.
 */
final class LiveOut implements AutoCloseable {
  static final byte VERSION = 1;
  private static final int JOURNAL_BATCH_MAX = 5_000;
  private static final long HEAD_ACTIVE_NS = 600_000_000_000L;
  private static final int BIND_ATTEMPTS = 60; // 15 s
  private static final int SUBSCRIPTIONS_QUIET_MS = 50;

  /** Above every epoch the journal holds (streaming/publisher.py's next_epoch), not this
   * JVM's clock: one stepped back over a restart would start an epoch below the last. */
  private final long epoch;
  private final int subscribersWaitMs;
  private final Map<String, StreamPosition> last = new HashMap<>();
  private final Map<String, Long> seenAt = new HashMap<>();
  private final ZContext zmq = new ZContext();
  private final ZMQ.Socket sock;
  private final KafkaProducer<byte[], byte[]> journal;
  private final String journalTopic;
  private final int journalPartitions;
  final AtomicLong sentTicks = new AtomicLong();
  final AtomicLong sentCandles = new AtomicLong();
  final AtomicLong dropped = new AtomicLong();
  final AtomicLong journalErrors = new AtomicLong();
  /** Frames a relay sent up the XPUB that are no (un)subscription. */
  final AtomicLong refused = new AtomicLong();

  /** A tick as read: the topic it goes out on, its Kafka value and position. */
  record Read(byte[] topic, byte[] value, int partition, long offset) {}

  /** A topic's messages in one round, with their positions. */
  private record Run(List<byte[]> records, List<StreamPosition> positions) {
    Run() {
      this(new ArrayList<>(), new ArrayList<>());
    }

    void add(byte[] record, StreamPosition pos) {
      records.add(record);
      positions.add(pos);
    }
  }

  LiveOut(Properties conf) {
    epoch = Long.parseLong(conf.getProperty("epoch"));
    sock = zmq.createSocket(SocketType.XPUB);
    sock.setXpubNoDrop(true);
    sock.setSndHWM(Integer.parseInt(conf.getProperty("hwm")));
    sock.setMaxMsgSize(Long.parseLong(conf.getProperty("max_message_bytes")));
    sock.setLinger(500);
    if (conf.getProperty("curve_server") != null) {
      // Bound, yet a CURVE client: relays dial it and authenticate the publisher key.
      sock.setCurvePublicKey(ZMQ.Curve.z85Decode(conf.getProperty("curve_public")));
      sock.setCurveSecretKey(ZMQ.Curve.z85Decode(conf.getProperty("curve_secret")));
      sock.setCurveServerKey(ZMQ.Curve.z85Decode(conf.getProperty("curve_server")));
    }
    subscribersWaitMs = Integer.parseInt(conf.getProperty("subscribers_wait_ms"));
    bind(conf.getProperty("bind"));
    // The relays it dials: a pipe ends with its connection, and that relay's subscriptions
    // with it (candlewire.zmqutil.publish_to_relays); else a relay gone down kept them, its
    // queue filled, and XPUB_NODROP refused every message to the relays still up. libzmq's
    // ZMQ_IMMEDIATE; JeroMQ's own "immediate" option means the opposite (attach at once).
    sock.setDelayAttachOnConnect(true);
    for (String endpoint : conf.getProperty("connect", "").split(",")) {
      if (!endpoint.isBlank()) {
        sock.connect(endpoint.trim());
      }
    }
    Properties kafka = new Properties();
    // kafka.bootstrap.servers and, with SASL, its settings: candlewire.kafka.spark_options.
    for (String name : conf.stringPropertyNames()) {
      if (name.startsWith("kafka.")) {
        kafka.put(name.substring("kafka.".length()), conf.getProperty(name));
      }
    }
    kafka.put("enable.idempotence", "true");
    kafka.put("acks", "all");
    kafka.put("linger.ms", "2");
    kafka.put("compression.type", "lz4");
    // Without a broker, a send waits this long for metadata, then counts a journal error.
    kafka.put("max.block.ms", "10000");
    journal = new KafkaProducer<>(kafka, new ByteArraySerializer(), new ByteArraySerializer());
    journalTopic = conf.getProperty("journal_topic");
    journalPartitions = Integer.parseInt(conf.getProperty("journal_partitions"));
  }

  /** A job restarted after a crash may find its JVM predecessor still exiting: wait for it. */
  private void bind(String endpoint) {
    for (int attempt = 0; ; attempt++) {
      try {
        sock.bind(endpoint);
        return;
      } catch (org.zeromq.ZMQException e) {
        if (e.getErrorCode() != ZMQ.Error.EADDRINUSE.getCode() || attempt >= BIND_ATTEMPTS) {
          throw e;
        }
      }
      try {
        Thread.sleep(250);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted while waiting for " + endpoint, e);
      }
    }
  }

  /** {@code candlewire.kafka.journal_partition}: crc32 of the topic, modulo partitions. */
  static int journalPartition(String topic, int partitions) {
    CRC32 crc = new CRC32();
    crc.update(topic.getBytes(StandardCharsets.UTF_8));
    return (int) (crc.getValue() % partitions);
  }

  private StreamPosition next(String topic, long nowMs, int partition, long offset) {
    StreamPosition prev = last.get(topic);
    StreamPosition pos =
        StreamPosition.newBuilder()
            .setEpoch(epoch)
            .setSeq(prev == null ? 1 : prev.getSeq() + 1)
            .setPublishTimeMs(nowMs)
            .setSourcePartition(partition)
            .setSourceOffset(offset)
            .build();
    last.put(topic, pos);
    seenAt.put(topic, System.nanoTime());
    return pos;
  }

  /** One round: ticks, then the candles they changed; journal first, then the socket. */
  void send(List<Read> ticks, List<OHLC.Builder> candles, byte[][] ohlcTopics) {
    long nowMs = System.currentTimeMillis();
    Map<String, Run> runs = new LinkedHashMap<>();
    List<byte[]> topics = new ArrayList<>(ticks.size() + candles.size());
    List<byte[]> records = new ArrayList<>(ticks.size() + candles.size());
    for (Read t : ticks) {
      String topic = new String(t.topic(), StandardCharsets.UTF_8);
      StreamPosition pos = next(topic, nowMs, t.partition(), t.offset());
      byte[] stamp = Tick.newBuilder().setStream(pos).build().toByteArray();
      byte[] record = new byte[t.value().length + stamp.length];
      System.arraycopy(t.value(), 0, record, 0, t.value().length);
      System.arraycopy(stamp, 0, record, t.value().length, stamp.length);
      runs.computeIfAbsent(topic, k -> new Run()).add(record, pos);
      topics.add(t.topic());
      records.add(record);
    }
    for (int i = 0; i < candles.size(); i++) {
      OHLC.Builder c = candles.get(i);
      String topic = new String(ohlcTopics[i], StandardCharsets.UTF_8);
      StreamPosition pos = next(topic, nowMs, 0, -1);
      byte[] record = envelope(MessageType.OHLC_CANDLE_VALUE, c.setStream(pos).build());
      runs.computeIfAbsent(topic, k -> new Run()).add(record, pos);
      topics.add(ohlcTopics[i]);
      records.add(record);
    }
    for (Map.Entry<String, Run> e : runs.entrySet()) {
      Run run = e.getValue();
      for (int i = 0; i < run.records().size(); i += JOURNAL_BATCH_MAX) {
        int end = Math.min(run.records().size(), i + JOURNAL_BATCH_MAX);
        journal(
            e.getKey(),
            run.records().subList(i, end),
            run.positions().get(i),
            run.positions().get(end - 1),
            nowMs);
      }
    }
    int drops = 0;
    for (int i = 0; i < records.size(); i++) {
      if (!frames(topics.get(i), records.get(i))) {
        drops++;
      }
    }
    sentTicks.addAndGet(ticks.size());
    sentCandles.addAndGet(candles.size());
    dropped.addAndGet(drops);
  }

  /** [topic][version][type + protobuf], whole or not at all: the first frame decides. */
  private boolean frames(byte[] topic, byte[] record) {
    if (!sock.send(topic, ZMQ.SNDMORE | ZMQ.DONTWAIT)) {
      return false;
    }
    sock.send(record, 0, 1, ZMQ.SNDMORE);
    sock.send(record, 1, record.length - 1, 0);
    return true;
  }

  /** A run's messages as JournalBatch's typed fields, each written as the bytes it has. */
  private void journal(
      String topic, List<byte[]> items, StreamPosition first, StreamPosition last, long nowMs) {
    boolean ticks = items.get(0)[1] == MessageType.TICK_VALUE;
    int field = ticks ? JournalBatch.TICKS_FIELD_NUMBER : JournalBatch.CANDLES_FIELD_NUMBER;
    try {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      bytes.write(VERSION);
      bytes.write(MessageType.JOURNAL_BATCH_VALUE);
      CodedOutputStream out = CodedOutputStream.newInstance(bytes);
      out.writeString(JournalBatch.TOPIC_FIELD_NUMBER, topic);
      out.writeMessage(JournalBatch.FIRST_FIELD_NUMBER, first);
      out.writeMessage(JournalBatch.LAST_FIELD_NUMBER, last);
      for (byte[] item : items) {
        out.writeByteArray(field, item, 2, item.length - 2);
      }
      out.flush();
      byte[] key = topic.getBytes(StandardCharsets.UTF_8);
      journal.send(
          new ProducerRecord<>(
              journalTopic,
              journalPartition(topic, journalPartitions),
              nowMs,
              key,
              bytes.toByteArray()),
          (meta, error) -> {
            if (error != null) {
              journalErrors.incrementAndGet();
            }
          });
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    } catch (RuntimeException e) {
      journalErrors.incrementAndGet();
    }
  }

  /** A beacon for every topic that published in the last ten minutes (not journalled). */
  void heads() {
    long horizon = System.nanoTime() - HEAD_ACTIVE_NS;
    for (Map.Entry<String, Long> e : seenAt.entrySet()) {
      if (e.getValue() >= horizon) {
        String topic = e.getKey();
        StreamHead head = StreamHead.newBuilder().setTopic(topic).setLast(last.get(topic)).build();
        if (!frames(topic.getBytes(StandardCharsets.UTF_8), envelope(MessageType.STREAM_HEAD_VALUE, head))) {
          dropped.incrementAndGet();
        }
      }
    }
  }

  /** The relays' subscriptions: the XPUB applies them; anything else is counted. */
  void drainSubscriptions() {
    byte[] frame;
    while ((frame = sock.recv(ZMQ.DONTWAIT)) != null) {
      subscription(frame);
    }
  }

  private boolean subscription(byte[] frame) {
    if (frame.length == 0 || (frame[0] != 0 && frame[0] != 1)) {
      refused.incrementAndGet();
      return false;
    }
    return frame[0] == 1;
  }

  /**
   * Before the first round: until a relay's subscriptions have arrived, at most {@code
   * subscribers_wait_ms}. A restarted job's first rounds replay what its predecessor had not
   * committed, at once; relays redial a gone publisher with a back-off, and an XPUB drops
   * what nobody has subscribed to yet, so without this wait those rounds' candle updates
   * would reach no plain subscriber. A relay sends all its subscriptions as it connects: once
   * the first is in, a short quiet drains the rest.
   */
  void awaitSubscribers() {
    long deadline = System.nanoTime() + subscribersWaitMs * 1_000_000L;
    int timeout = subscribersWaitMs;
    boolean subscribed = false;
    try {
      while (timeout > 0) {
        sock.setReceiveTimeOut(timeout);
        byte[] frame = sock.recv(0);
        if (frame == null) {
          return;
        }
        subscribed |= subscription(frame);
        timeout = (int) Math.min(subscribed ? SUBSCRIPTIONS_QUIET_MS : Integer.MAX_VALUE,
            (deadline - System.nanoTime()) / 1_000_000L);
      }
    } finally {
      sock.setReceiveTimeOut(-1);
    }
  }

  static byte[] envelope(int type, com.google.protobuf.MessageLite msg) {
    byte[] body = msg.toByteArray();
    byte[] record = new byte[body.length + 2];
    record[0] = VERSION;
    record[1] = (byte) type;
    System.arraycopy(body, 0, record, 2, body.length);
    return record;
  }

  @Override
  public void close() {
    journal.close(java.time.Duration.ofSeconds(10));
    zmq.close();
  }
}
