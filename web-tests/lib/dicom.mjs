// DICOM files made by the browser tests: data elements in explicit VR little endian, and a
// Part 10 file (preamble, "DICM", the file meta group with its length) around a data set.

/** One data element, explicit VR little endian; values padded to an even length. */
export function element(group, elem, vr, value) {
  const long = ['OB', 'OW', 'UN', 'SQ', 'UT'].includes(vr);
  let body = Buffer.isBuffer(value) ? value : Buffer.from(value, 'latin1');
  if (body.length % 2) body = Buffer.concat([body, Buffer.from(vr === 'UI' || vr === 'OB' ? [0] : [0x20])]);
  const head = Buffer.alloc(long ? 12 : 8);
  head.writeUInt16LE(group, 0);
  head.writeUInt16LE(elem, 2);
  head.write(vr, 4, 'latin1');
  if (long) head.writeUInt32LE(body.length, 8);
  else head.writeUInt16LE(body.length, 6);
  return Buffer.concat([head, body]);
}

/** A US value. */
export const us = (n) => { const b = Buffer.alloc(2); b.writeUInt16LE(n); return b; };

/**
 * A Part 10 file of SOP class `sop`, instance `instance`, in Explicit VR Little Endian, whose
 * data set is `elements` (encoded, in ascending tag order).
 */
export function part10({ sop, instance, elements }) {
  const metaBody = Buffer.concat([
    element(0x0002, 0x0001, 'OB', Buffer.from([0, 1])),
    element(0x0002, 0x0002, 'UI', sop),
    element(0x0002, 0x0003, 'UI', instance),
    element(0x0002, 0x0010, 'UI', '1.2.840.10008.1.2.1'),
    element(0x0002, 0x0012, 'UI', '1.2.826.0.1.3680043.10.543.99'),
  ]);
  const metaLen = Buffer.alloc(4);
  metaLen.writeUInt32LE(metaBody.length);
  return Buffer.concat([
    Buffer.alloc(128),
    Buffer.from('DICM', 'latin1'),
    element(0x0002, 0x0000, 'UL', metaLen),
    metaBody,
    ...elements,
  ]);
}

/**
 * A sequence (explicit VR little endian, defined lengths) of items, each the encoding of its
 * data elements (in ascending tag order).
 */
export function sequence(group, elem, items) {
  const encoded = items.map((item) => {
    const head = Buffer.alloc(8);
    head.writeUInt16LE(0xfffe, 0);
    head.writeUInt16LE(0xe000, 2);
    head.writeUInt32LE(item.length, 4);
    return Buffer.concat([head, item]);
  });
  return element(group, elem, 'SQ', Buffer.concat(encoded));
}
