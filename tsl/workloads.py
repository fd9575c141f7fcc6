"""Layer shapes of the networks the bench and the back ends' suites are measured on, in one
place (each suite picks the rows it runs, in its own order and dtype).

RESNET18: (H=W, Cin, Cout, kernel, pad, stride) of ResNet-18's conv layers C2..C11 at 224x224.
BERT_BASE: one BERT-base layer at sequence 128 as GEMMs (M, N, K): the fused QKV projection,
the attention output projection and the two FFN GEMMs.
"""

RESNET18 = ((56, 64, 64, 3, 1, 1), (56, 64, 128, 3, 1, 2), (56, 64, 128, 1, 0, 2),
            (28, 128, 128, 3, 1, 1), (28, 128, 256, 3, 1, 2), (28, 128, 256, 1, 0, 2),
            (14, 256, 256, 3, 1, 1), (14, 256, 512, 3, 1, 2), (14, 256, 512, 1, 0, 2),
            (7, 512, 512, 3, 1, 1))
BERT_BASE = {"qkv": (128, 2304, 768), "attention_out": (128, 768, 768),
             "ffn_in": (128, 3072, 768), "ffn_out": (128, 768, 3072)}
