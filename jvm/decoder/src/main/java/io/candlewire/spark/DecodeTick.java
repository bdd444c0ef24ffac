package io.candlewire.spark;

import candlewire.v1.Envelope.MessageType;
import candlewire.v1.MarketOuterClass.FeedIdle;
import candlewire.v1.MarketOuterClass.Tick;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.WireFormat;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.math.BigDecimal;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * A record of the ticks topic as one row of {@code streaming.decode.TICK_ROWS}, decoded where
 * Spark reads it: no Python worker, no Arrow round trip. {@code streaming.decode.decode_ticks} is
 * the reference; {@code tests/streaming/test_decode_jvm.py} checks that both give the same row
 * for every envelope, malformed ones included. A record that is not a valid tick or idle mark is
 * a row with {@code valid = false} that the job counts and drops, never an exception.
 */
public final class DecodeTick implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;
  static final byte PROTOCOL_VERSION = 1;

  // The columns of a decoded row (streaming.decode.TICK_ROWS), for every reader of one.
  static final int VALID = 0;
  static final int IDLE = 1;
  static final int TICKER = 2;
  static final int TRADE_ID = 3;
  static final int PRICE = 4;
  static final int SIZE = 5;
  static final int SIDE = 6;
  static final int TIME = 7;
  static final int INGEST = 8;
  /** upb's limits, which Python's protobuf applies and protobuf-java does not. */
  private static final int MAX_TAG_BYTES = 5;

  private static final int MAX_DEPTH = 100;

  private static final int SLOW_PATH_BUFFER = 9;

  /** {@code proto.envelope.MAX_STRING_BYTES}: a longer string field makes the record invalid. */
  private static final int MAX_STRING_BYTES = 4096;

  private static final Row INVALID = row(false, false, null, null, null, null, null, null, null);

  @Override
  public Row call(byte[] value) {
    return decode(value);
  }

  /** DECIMAL(38,18), the tables' type: at most 20 digits before the point, 18 after. */
  private static final int INTEGER_DIGITS = 20;

  private static final int SCALE = 18;

  /**
   * A valid tick row's price and size, or null for one that DECIMAL(38,18) does not hold
   * exactly: both paths count it bad, no candle folds it and no trigger judges it. Folded, a
   * price of 21 digits failed the committing query's write of {@code ticks} at every restart
   * (the pipeline stopped for good), and a 19th decimal was rounded one way in {@code ticks},
   * another in {@code ohlc} and not at all live; an exponent of millions made a text of as
   * many digits for each candle. A trade without a time (at or before 1970, as the ingestors'
   * rule has it) is bad too: a feed's clock of 0 is no clock, and such trades replaced one
   * another in a candle closed as it formed.
   */
  static BigDecimal[] amounts(Row r) {
    if (r.getLong(TIME) <= 0) {
      return null;
    }
    try {
      BigDecimal price = new BigDecimal(r.getString(PRICE));
      BigDecimal size = new BigDecimal(r.getString(SIZE));
      return held(price) && held(size) ? new BigDecimal[] {price, size} : null;
    } catch (NumberFormatException e) {
      return null; // an exponent beyond an int
    }
  }

  /** Whether DECIMAL(38,18) holds {@code value} exactly. */
  static boolean held(BigDecimal value) {
    if (value.signum() == 0) {
      return true;
    }
    // Digits before the point, and after it without trailing zeros, read off the unscaled
    // value's digit count: no stripTrailingZeros (a copy) for the common value in range.
    int scale = value.scale();
    long before = (long) value.precision() - scale; // a scale near an int's least wraps
    if (before > INTEGER_DIGITS) {
      return false;
    }
    return scale <= SCALE || value.stripTrailingZeros().scale() <= SCALE;
  }

  /** The UDF's row for one record; {@link Live} decodes with it too, so both paths agree. */
  static Row decode(byte[] value) {
    return value == null ? INVALID : decode(value, 0, value.length);
  }

  /**
   * {@link #decode(byte[])} of the record held in {@code buf} at {@code off}, {@code len} bytes
   * long: a group's values are read where {@link Commit} keeps them, in a few large arrays.
   */
  static Row decode(byte[] buf, int off, int len) {
    // [version byte][type byte][protobuf]: streaming.decode.parse_tick via proto.envelope.
    if (len < 2 || buf[off] != PROTOCOL_VERSION) {
      return INVALID;
    }
    int type = buf[off + 1] & 0xff;
    try {
      if (type == MessageType.TICK_VALUE) {
        CodedInputStream in = checked(buf, off + 2, len - 2, Tick.getDescriptor());
        return in == null ? INVALID : tick(Tick.parseFrom(in));
      }
      if (type == MessageType.FEED_IDLE_VALUE) {
        CodedInputStream in = checked(buf, off + 2, len - 2, FeedIdle.getDescriptor());
        return in == null ? INVALID : idle(FeedIdle.parseFrom(in));
      }
    } catch (IOException | RuntimeException e) {
      return INVALID; // never fail the query: the job counts and drops the record
    }
    return INVALID;
  }

  /**
   * The payload to parse, or null where Python's parser (upb) would reject it and protobuf-java
   * would not: a tag longer than 5 bytes or wider than 32 bits, anywhere in the message. A
   * 10-byte varint whose last byte is not 1 (never written so) gets a different top bit from
   * protobuf-java's fast path than from upb; such a payload is parsed on the byte-at-a-time
   * path, which agrees with upb. A text field of the message longer than {@link
   * #MAX_STRING_BYTES} makes it null too (its last occurrence: the value the parse keeps, which
   * proto.envelope judges). tests/streaming/test_decode_jvm.py fuzzes both decoders.
   */
  private static CodedInputStream checked(byte[] buf, int off, int len, Descriptor type)
      throws IOException {
    Scan scan = new Scan(type);
    try {
      if (!scan.message(CodedInputStream.newInstance(buf, off, len), type, 0, 0)) {
        return null;
      }
    } catch (InvalidProtocolBufferException e) {
      return null; // truncated or malformed: the parse would reject it too
    }
    for (int size : scan.textBytes) {
      if (size > MAX_STRING_BYTES) {
        return null;
      }
    }
    if (scan.wideVarint) {
      // A buffer shorter than a varint's 10 bytes keeps every read on the slow path.
      InputStream bytes = new ByteArrayInputStream(buf, off, len);
      return CodedInputStream.newInstance(bytes, SLOW_PATH_BUFFER);
    }
    return CodedInputStream.newInstance(buf, off, len);
  }

  /**
   * Each field of the types a tick or idle mark holds, by number: {@code findFieldByNumber}
   * allocates a key for every lookup.
   */
  private static final Map<Descriptor, FieldDescriptor[]> FIELDS = new HashMap<>();

  static {
    for (Descriptor root : List.of(Tick.getDescriptor(), FeedIdle.getDescriptor())) {
      index(root);
    }
  }

  private static void index(Descriptor type) {
    if (FIELDS.containsKey(type)) {
      return;
    }
    int top = type.getFields().stream().mapToInt(FieldDescriptor::getNumber).max().orElse(0);
    FieldDescriptor[] byNumber = new FieldDescriptor[top + 1];
    FIELDS.put(type, byNumber);
    for (FieldDescriptor f : type.getFields()) {
      byNumber[f.getNumber()] = f;
      if (f.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
        index(f.getMessageType());
      }
    }
  }

  /** A field of a type {@link #index} reached (every type a scan descends into), or null. */
  private static FieldDescriptor field(Descriptor type, int number) {
    FieldDescriptor[] byNumber = type == null ? null : FIELDS.get(type);
    return byNumber != null && number < byNumber.length ? byNumber[number] : null;
  }

  /** One pass over a payload's tags, in sub-messages and groups too. */
  private static final class Scan {
    boolean wideVarint;
    /** The top message's text fields, by number: the byte size of each one's last occurrence. */
    final int[] textBytes;

    Scan(Descriptor top) {
      textBytes = new int[FIELDS.get(top).length];
    }

    boolean message(CodedInputStream in, Descriptor type, int group, int depth)
        throws IOException {
      if (depth > MAX_DEPTH) {
        return false;
      }
      while (!in.isAtEnd()) {
        int start = in.getTotalBytesRead();
        long raw = in.readRawVarint64();
        if (in.getTotalBytesRead() - start > MAX_TAG_BYTES || (raw >>> 32) != 0) {
          return false;
        }
        int tag = (int) raw;
        int number = WireFormat.getTagFieldNumber(tag);
        int wire = WireFormat.getTagWireType(tag);
        FieldDescriptor field = field(type, number);
        if (wire == WireFormat.WIRETYPE_END_GROUP) {
          return number == group;
        } else if (wire == WireFormat.WIRETYPE_START_GROUP) {
          if (!message(in, null, number, depth + 1)) {
            return false;
          }
        } else if (wire == WireFormat.WIRETYPE_VARINT) {
          varint(in);
        } else if (wire == WireFormat.WIRETYPE_LENGTH_DELIMITED
            && field != null
            && field.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
          int limit = in.pushLimit(in.readRawVarint32());
          if (!message(in, field.getMessageType(), 0, depth + 1)) {
            return false;
          }
          in.popLimit(limit);
        } else if (wire == WireFormat.WIRETYPE_LENGTH_DELIMITED
            && depth == 0
            && field != null
            && field.getType() == FieldDescriptor.Type.STRING) {
          int size = in.readRawVarint32(); // measured here: no text made to measure it
          textBytes[number] = size;
          in.skipRawBytes(size);
        } else {
          in.skipField(tag);
        }
      }
      return group == 0;
    }

    private void varint(CodedInputStream in) throws IOException {
      for (int i = 1; i <= 10; i++) {
        byte b = in.readRawByte();
        if (b >= 0) {
          wideVarint |= i == 10 && b != 1;
          return;
        }
      }
      throw new InvalidProtocolBufferException("CodedInputStream encountered a malformed varint.");
    }
  }

  private static Row tick(Tick t) {
    if (t.getTicker().isEmpty()
        || !isDecimal(t.getPrice())
        || !isPositive(t.getPrice())
        || !isDecimal(t.getSize())
        || t.getSize().startsWith("-")) {
      return INVALID;
    }
    return row(
        true,
        false,
        t.getTicker(),
        t.getTradeId(),
        t.getPrice(),
        t.getSize(),
        side(t.getSideValue()),
        t.getExchangeTimeNs(),
        t.getIngestTimeNs() == 0 ? null : t.getIngestTimeNs());
  }

  private static Row idle(FeedIdle f) {
    if (f.getTicker().isEmpty()) {
      return INVALID;
    }
    return row(false, true, f.getTicker(), null, null, null, null, f.getEventTimeNs(), null);
  }

  /**
   * The wire's decimal strings, as {@code streaming.decode.DECIMAL_TEXT} spells them: {@code
   * [+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?}, whole. Scanned by hand: the
   * three regex matches of a tick took 310-580 ns, a third of its decode.
   */
  static boolean isDecimal(String text) {
    int n = text.length();
    int i = sign(text, 0);
    int whole = i;
    i = digits(text, i);
    boolean any = i > whole;
    if (i < n && text.charAt(i) == '.') {
      int fraction = ++i;
      i = digits(text, i);
      any |= i > fraction;
    }
    if (!any) {
      return false;
    }
    if (i < n && (text.charAt(i) == 'e' || text.charAt(i) == 'E')) {
      int exponent = sign(text, i + 1);
      i = digits(text, exponent);
      if (i == exponent) {
        return false;
      }
    }
    return i == n;
  }

  /**
   * A decimal string (as {@link #isDecimal} passes) above zero, as {@code
   * streaming.decode.POSITIVE_TEXT} spells it ({@code \+?[^eE-]*[1-9].*}): a digit 1-9 comes
   * before any sign or exponent.
   */
  static boolean isPositive(String decimal) {
    for (int i = 0; i < decimal.length(); i++) {
      char c = decimal.charAt(i);
      if (c >= '1' && c <= '9') {
        return true;
      }
      if (c == 'e' || c == 'E' || c == '-') {
        return false;
      }
    }
    return false;
  }

  private static int sign(String text, int i) {
    return i < text.length() && (text.charAt(i) == '+' || text.charAt(i) == '-') ? i + 1 : i;
  }

  private static int digits(String text, int i) {
    while (i < text.length() && text.charAt(i) >= '0' && text.charAt(i) <= '9') {
      i++;
    }
    return i;
  }

  private static String side(int value) {
    if (value == 1) {
      return "BUY";
    }
    return value == 2 ? "SELL" : null;
  }

  private static Row row(
      boolean valid,
      boolean idle,
      String ticker,
      String tradeId,
      String price,
      String size,
      String side,
      Long exchangeTimeNs,
      Long ingestTimeNs) {
    return RowFactory.create(
        valid, idle, ticker, tradeId, price, size, side, exchangeTimeNs, ingestTimeNs);
  }
}
